"""Run discovery on a host through its driver and turn the output into a `Discovery` (pure Python).

Every failure becomes `DiscoveryFailed(code, message)` with a message that tells the provider admin
what to do; codes match inventory.choices.OnboardingError.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from inventory.discovery.ibstat import parse_ibstat
from inventory.discovery.nvidia_smi import parse_query_gpu
from inventory.discovery.topo import parse_topo
from inventory.discovery.types import QUERY_FIELDS, GpuInfo, IbPort, ParseError, TopoMatrix
from inventory.drivers.base import DriverError, HostDriver

QUERY_COMMAND = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv"
_MISSING = 127  # shell status for "command not found"
_NO_DEVICES = 6  # nvidia-smi: "No devices were found"


class DiscoveryFailed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Discovery:
    gpus: tuple[GpuInfo, ...]
    nvlink_domains: tuple[tuple[int, ...], ...]
    ib_ports: tuple[IbPort, ...]
    nic_names: tuple[str, ...]
    # From `topo -m` (empty when it could not be read): placement's locality on PCIe-only hosts.
    pcie_switches: tuple[tuple[int, ...], ...] = ()
    numa_nodes: tuple[tuple[int, ...], ...] = ()

    @property
    def gpu_model(self) -> str:
        models = sorted({g.model for g in self.gpus})
        return models[0] if len(models) == 1 else " + ".join(models)

    def domain_of(self, index: int) -> int:
        for number, domain in enumerate(self.nvlink_domains):
            if index in domain:
                return number
        return 0

    def as_json(self) -> dict:
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "nvlink_domains": [list(d) for d in self.nvlink_domains],
            "ib_ports": [asdict(p) for p in self.ib_ports],
            "nics": list(self.nic_names),
            "pcie_switches": [list(g) for g in self.pcie_switches],
            "numa_nodes": [list(g) for g in self.numa_nodes],
        }

    def pcie_topology(self) -> dict:
        """What Host.pcie_topology stores: GPU indices per PCIe switch and per NUMA node."""
        return {"switches": [list(g) for g in self.pcie_switches], "numa": [list(g) for g in self.numa_nodes]}


def discover(driver: HostDriver, timeout: float = 20.0, max_temp_c: int = 90) -> Discovery:
    """Reach the host, read its GPUs, NVLink topology and InfiniBand ports, and check GPU health."""
    _call(driver.check_reachable, timeout)
    query = _query_gpus(driver, timeout)
    if not query.gpus and not query.lost:
        raise DiscoveryFailed(
            "no_gpus",
            "nvidia-smi ran but listed no GPUs; check that the NVIDIA driver sees the cards (nvidia-smi -L).",
        )
    topo = _topology(driver, timeout)
    ports = _ib_ports(driver, timeout)
    discovery = Discovery(
        gpus=query.gpus,
        nvlink_domains=tuple(tuple(d) for d in topo.nvlink_domains())
        if topo
        else tuple((g.index,) for g in query.gpus),
        ib_ports=ports,
        nic_names=tuple(topo.nic_names.values()) if topo else (),
        **_pcie(topo),
    )
    _check_health(query, max_temp_c)
    return discovery


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


def _ib_ports(driver: HostDriver, timeout: float) -> tuple[IbPort, ...]:
    result = _call(driver.run, "command -v ibstat >/dev/null && ibstat || true", timeout)
    try:
        return parse_ibstat(result.stdout)
    except ParseError as exc:
        raise DiscoveryFailed("parse_failed", f"ibstat output could not be read: {exc}") from exc


def _check_health(query, max_temp_c: int) -> None:
    problems = [f"lost: {message}" for message in query.lost]
    for gpu in query.gpus:
        if gpu.ecc_uncorrectable:
            problems.append(f"GPU {gpu.index} reports {gpu.ecc_uncorrectable} uncorrectable ECC errors")
        if gpu.temperature_c is not None and gpu.temperature_c > max_temp_c:
            problems.append(f"GPU {gpu.index} runs at {gpu.temperature_c} C (limit {max_temp_c} C)")
    if problems:
        raise DiscoveryFailed(
            "gpu_unhealthy",
            "GPU health check failed: "
            + "; ".join(problems)
            + ". Replace or reseat the GPU (or reset it with nvidia-smi -r), then retry onboarding.",
        )
