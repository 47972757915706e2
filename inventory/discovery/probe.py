"""Run discovery on a host through its driver and turn the output into a `Discovery` (pure Python).

Every failure becomes `DiscoveryFailed(code, message)` with a message that tells the provider admin
what to do; codes match inventory.choices.OnboardingError.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from inventory.discovery.ibstat import parse_ibstat
from inventory.discovery.network import SYSFS_COMMAND, parse_sysfs_ports, port_counts, with_roce_flags
from inventory.discovery.nvidia_smi import parse_query_gpu
from inventory.discovery.system import SYSTEM_COMMAND, HostSystem, parse_system
from inventory.discovery.topo import parse_topo
from inventory.discovery.types import QUERY_FIELDS, GpuInfo, IbPort, ParseError, TopoMatrix
from inventory.drivers.base import DriverError, HostDriver

QUERY_COMMAND = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv"
_MISSING = 127  # shell status for "command not found"
_NO_DEVICES = 6  # nvidia-smi: "No devices were found"
_DRIVER_NOT_LOADED = 9  # nvidia-smi: "couldn't communicate with the NVIDIA driver"
_DRIVER_MESSAGE = "couldn't communicate with the NVIDIA driver"


class DiscoveryFailed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class LostGpu:
    """A GPU nvidia-smi names only by its PCI address ("Unable to determine the device handle ...")."""

    pci_bus_id: str  # normalised "1b:00.0" ("" if the line names none)
    message: str


@dataclass(frozen=True)
class Discovery:
    gpus: tuple[GpuInfo, ...]
    nvlink_domains: tuple[tuple[int, ...], ...]
    ib_ports: tuple[IbPort, ...]
    nic_names: tuple[str, ...]
    nics: tuple[dict, ...] = ()  # {"name": "mlx5_0", "gpu_link": "PIX", "closest_gpus": [0]} from topo -m
    gpu_problems: dict[int, str] = field(default_factory=dict)  # index -> why it is unhealthy
    lost: tuple[LostGpu, ...] = ()
    # From `topo -m` (empty when it could not be read): placement's locality on PCIe-only hosts.
    pcie_switches: tuple[tuple[int, ...], ...] = ()
    numa_nodes: tuple[tuple[int, ...], ...] = ()
    # OS, kernel, Pythons, driver/CUDA versions, Volt's privilege (discovery/system.py): Host.system.
    system: HostSystem = field(default_factory=HostSystem)

    @property
    def gpu_model(self) -> str:
        models = sorted({g.model for g in self.gpus})
        return models[0] if len(models) == 1 else " + ".join(models)

    @property
    def healthy_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if g.index not in self.gpu_problems)

    def nic_of(self, ca: str) -> dict:
        """The `topo -m` facts of NIC `ca` ({} when topo -m did not list it)."""
        return next((nic for nic in self.nics if nic["name"] == ca), {})

    def domain_of(self, index: int) -> int:
        for number, domain in enumerate(self.nvlink_domains):
            if index in domain:
                return number
        return 0

    def as_json(self) -> dict:
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "nvlink_domains": [list(d) for d in self.nvlink_domains],
            "ib_ports": [asdict(p) | {"transport": p.transport} for p in self.ib_ports],
            "nics": list(self.nic_names),
            "nic_gpus": [dict(nic) for nic in self.nics],
            "port_counts": port_counts(self.ib_ports),
            "gpu_problems": {str(index): reason for index, reason in sorted(self.gpu_problems.items())},
            "lost_gpus": [asdict(lost) for lost in self.lost],
            "pcie_switches": [list(g) for g in self.pcie_switches],
            "numa_nodes": [list(g) for g in self.numa_nodes],
        }

    def pcie_topology(self) -> dict:
        """What Host.pcie_topology stores: GPU indices per PCIe switch and per NUMA node."""
        return {"switches": [list(g) for g in self.pcie_switches], "numa": [list(g) for g in self.numa_nodes]}


def discover(driver: HostDriver, timeout: float = 20.0, max_temp_c: int = 90) -> Discovery:
    """Reach the host, read its GPUs, NVLink topology and InfiniBand ports, and check GPU health.

    A GPU that is lost, too hot or reports uncorrectable ECC errors is named in `gpu_problems` /
    `lost`; only a host with no healthy GPU at all fails (gpu_unhealthy).
    """
    _call(driver.check_reachable, timeout)
    query = _query_gpus(driver, timeout)
    if not query.gpus and not query.lost:
        raise DiscoveryFailed(
            "no_gpus",
            "nvidia-smi ran but listed no GPUs; check that the NVIDIA driver sees the cards (nvidia-smi -L).",
        )
    problems = gpu_problems(query.gpus, max_temp_c)
    lost = tuple(LostGpu(lost_bus_id(line), line) for line in query.lost)
    _check_some_gpu_healthy(query.gpus, problems, lost)
    topo = _topology(driver, timeout)
    ports = _ib_ports(driver, timeout)
    system = host_system(driver, timeout)
    return Discovery(
        gpus=query.gpus,
        nvlink_domains=tuple(tuple(d) for d in topo.nvlink_domains())
        if topo
        else tuple((g.index,) for g in query.gpus),
        ib_ports=ports,
        nic_names=tuple(topo.nic_names.values()) if topo else (),
        nics=_nics(topo, ports),
        gpu_problems=problems,
        lost=lost,
        system=system,
        **_pcie(topo),
    )


def host_system(driver: HostDriver, timeout: float) -> HostSystem:
    """The host's OS, kernel, Pythons, driver and CUDA versions and Volt's privilege there. Never fails
    onboarding: a host that does not answer the command records no facts (the GPUs were read already)."""
    try:
        result = driver.run(SYSTEM_COMMAND, timeout)
    except DriverError:
        return HostSystem()
    return parse_system(result.stdout)


def _pcie(topo: TopoMatrix | None) -> dict:
    if topo is None:
        return {}
    switches, numa = topo.pcie_groups()
    return {"pcie_switches": tuple(map(tuple, switches)), "numa_nodes": tuple(map(tuple, numa))}


def _call(fn, *args):
    try:
        return fn(*args)
    except DriverError as exc:
        raise DiscoveryFailed(exc.code, str(exc)) from exc


def _query_gpus(driver: HostDriver, timeout: float):
    result = _call(driver.run, QUERY_COMMAND, timeout)
    if (
        result.exit_status == _MISSING
        or "nvidia-smi: not found" in result.stderr
        or ("command not found" in result.stderr)
    ):
        raise DiscoveryFailed(
            "nvidia_smi_missing",
            "nvidia-smi is not installed or not on PATH; install the NVIDIA driver (it ships nvidia-smi) and retry.",
        )
    if result.exit_status == _DRIVER_NOT_LOADED or _DRIVER_MESSAGE in result.stdout + result.stderr:
        raise DiscoveryFailed(
            "driver_not_loaded",
            "nvidia-smi is installed but cannot talk to the NVIDIA driver (it printed: "
            f"{(result.stdout or result.stderr).strip()[:200]!r}): the kernel module is not loaded. "
            "Load it with `sudo modprobe nvidia` (after a kernel upgrade, reinstall the driver for the running "
            "kernel; `dmesg | grep -i nvidia` says why it failed), check `nvidia-smi` works, then retry.",
        )
    try:
        query = parse_query_gpu(result.stdout)
    except ParseError as exc:
        raise DiscoveryFailed(
            "parse_failed",
            f"nvidia-smi printed output Volt cannot read ({exc}); check the driver install "
            f"by running `{QUERY_COMMAND}` on the host.",
        ) from exc
    if not query.gpus and not query.lost and result.exit_status in (0, _NO_DEVICES):
        return query  # "No devices were found": the caller reports no_gpus
    if result.exit_status != 0 and not query.lost:
        detail = (result.stderr or result.stdout).strip()[:300]
        raise DiscoveryFailed("parse_failed", f"nvidia-smi failed with status {result.exit_status}: {detail}")
    return query


def _topology(driver: HostDriver, timeout: float):
    result = _call(driver.run, "nvidia-smi topo -m", timeout)
    if result.exit_status != 0:
        return None
    try:
        return parse_topo(result.stdout)
    except ParseError as exc:
        raise DiscoveryFailed(
            "parse_failed", f"`nvidia-smi topo -m` output could not be read: {exc}"
        ) from exc


_IBSTAT_COMMAND = (
    "if command -v ibstat >/dev/null; then ibstat; else echo 'ibstat: not found' >&2; exit 127; fi"
)


def _ib_ports(driver: HostDriver, timeout: float) -> tuple[IbPort, ...]:
    """ibstat's ports (RoCE told from plain Ethernet by sysfs GIDs); sysfs alone where ibstat is absent."""
    result = _call(driver.run, _IBSTAT_COMMAND, timeout)
    sysfs = _call(driver.run, SYSFS_COMMAND, timeout)
    try:
        sysfs_ports = parse_sysfs_ports(sysfs.stdout)
    except ParseError as exc:
        raise DiscoveryFailed("parse_failed", f"/sys/class/infiniband could not be read: {exc}") from exc
    if result.exit_status == _MISSING:
        return sysfs_ports
    try:
        return with_roce_flags(parse_ibstat(result.stdout), sysfs_ports)
    except ParseError as exc:
        raise DiscoveryFailed("parse_failed", f"ibstat output could not be read: {exc}") from exc


def _nics(topo, ports: tuple[IbPort, ...]) -> tuple[dict, ...]:
    """Each NIC of `topo -m` with the GPUs nearest to it: {"name", "gpu_link", "closest_gpus"}."""
    if topo is None:
        return ()
    nics = []
    for alias in topo.nics:
        link, gpus = topo.closest_gpus(alias)
        nics.append({"name": topo.nic_names.get(alias, alias), "gpu_link": link, "closest_gpus": list(gpus)})
    return tuple(nics)


def gpu_problems(gpus: tuple[GpuInfo, ...], max_temp_c: int) -> dict[int, str]:
    """Why each unhealthy GPU is unhealthy (index -> reason); healthy GPUs are absent."""
    problems: dict[int, str] = {}
    for gpu in gpus:
        reasons = []
        if gpu.ecc_uncorrectable:
            reasons.append(f"reports {gpu.ecc_uncorrectable} uncorrectable ECC errors")
        if gpu.temperature_c is not None and gpu.temperature_c > max_temp_c:
            reasons.append(f"runs at {gpu.temperature_c} C (limit {max_temp_c} C)")
        if reasons:
            problems[gpu.index] = "; ".join(reasons)
    return problems


_BUS_ID = re.compile(r"(?:[0-9a-f]{4,8}:)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\b", re.I)


def lost_bus_id(text: str) -> str:
    """The PCI bus:device.function of a PCI address or lost-GPU line, lower case ("1b:00.0"); "" if none."""
    match = _BUS_ID.search(text.split("GPU", 1)[-1] if "device handle" in text else text)
    return match.group(1).lower() if match else ""


def _check_some_gpu_healthy(gpus: tuple[GpuInfo, ...], problems: dict[int, str], lost: tuple[LostGpu, ...]):
    if any(gpu.index not in problems for gpu in gpus):
        return
    lines = [f"lost: {item.message}" for item in lost]
    lines += [f"GPU {index} {reason}" for index, reason in sorted(problems.items())]
    raise DiscoveryFailed(
        "gpu_unhealthy",
        "No healthy GPU on this host: "
        + "; ".join(lines)
        + ". Replace or reseat the GPUs (or reset them with nvidia-smi -r), then retry onboarding.",
    )
