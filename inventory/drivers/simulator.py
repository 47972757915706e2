"""Simulated `nvidia-smi` and `ibstat` for `local` hosts: the real output formats, from a spec.

Run as ``python -m inventory.drivers.simulator nvidia-smi ARGS...`` (or ``ibstat ARGS...``) with
``VOLT_HOST_ROOT`` naming the sandbox. Pure Python: stdlib, the GPU catalog and QUERY_FIELDS only.

``$VOLT_HOST_ROOT/spec.json``::

    {"gpu_model": "H100", "gpu_count": 8, "nvlink": true,
     "nics": [{"name": "mlx5_0", "link_layer": "InfiniBand", "rate_gbps": 400, "state": "Active"}],
     "driver_version": "550.54.15", "cuda_version": "12.4", "seed": "iad1-h100-01"}

`nvlink` defaults to the model's, `nics` to none (a NIC's `link_layer` to InfiniBand, `rate_gbps` to
400, `state` to Active; "Down" prints a disabled port; an Ethernet NIC is RoCE unless `"roce": false`,
a plain Ethernet port whose sysfs GID table has no RoCE entries), `seed` (stable, unique GPU UUIDs) to the
sandbox path. Faults are files in ``$VOLT_HOST_ROOT/faults/``, read at every call; the index lists
hold comma-separated GPU indices, and an empty file means every GPU:

    nvidia_smi_garbage  every nvidia-smi call prints garbage (the file's text if any), exit 0
    driver_not_loaded   every nvidia-smi call prints NVIDIA's "couldn't communicate with the NVIDIA
                        driver" message and exits 9 (the kernel module is not loaded)
    gpu_lost            those GPUs fell off the bus: "Unable to determine the device handle ..."
                        instead of their rows, exit 15; `topo -m` lists only the others
    ecc_uncorrectable   those GPUs report uncorrectable volatile ECC errors (ECC models only)
    hot                 those GPUs run at 96 C
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from inventory.discovery.types import QUERY_FIELDS
from inventory.gpu_catalog import BY_MODEL, GpuModel

# Exit statuses of the real nvidia-smi.
EXIT_INVALID_ARGUMENT = 2
EXIT_NO_DEVICES = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_GPU_LOST = 15
DRIVER_NOT_LOADED_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)

HOT_TEMPERATURE_C = 96
ECC_ERRORS_WHEN_FAULTY = 2
_UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%", "power.draw": "W"}
# PCI buses of the 8 GPUs of an HGX board (DGX H100); more GPUs continue on further buses.
_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


class SimulatorError(Exception):
    """The sandbox itself is broken (no spec, unknown model, bad fault file): not a simulated fault."""


@dataclass(frozen=True)
class Faults:
    garbage: str | None = None  # None: no fault; "": built-in garbage
    driver_not_loaded: bool = False
    lost: frozenset[int] = frozenset()
    ecc: frozenset[int] = frozenset()
    hot: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Host:
    model: GpuModel | None
    gpu_count: int
    nvlink: bool
    nics: tuple[dict, ...]
    driver_version: str
    cuda_version: str
    seed: str
    faults: Faults

    @property
    def present(self) -> list[int]:
        """Indices of the GPUs that still answer."""
        return [i for i in range(self.gpu_count) if i not in self.faults.lost]


def _read_spec(path: Path) -> dict:
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SimulatorError(f"cannot read {path}: {error}") from None
    nics = spec.get("nics", ()) if isinstance(spec, dict) else None
    if not isinstance(nics, list | tuple) or not all(isinstance(n, dict) and n.get("name") for n in nics):
        raise SimulatorError(f"{path} should hold an object whose nics each have a name")
    if not str(spec.get("gpu_count", 0)).isdigit():
        raise SimulatorError(f"{path}: gpu_count should be a whole number, not {spec['gpu_count']!r}")
    return spec


def load_host(root: Path) -> Host:
    """Read `spec.json` and the fault files of the sandbox at `root`."""
    spec = _read_spec(root / "spec.json")
    count = int(spec.get("gpu_count", 0))
    model = BY_MODEL.get(spec.get("gpu_model", ""))
    if count and model is None:
        known = ", ".join(BY_MODEL)
        raise SimulatorError(f"spec.json gpu_model {spec.get('gpu_model')!r} is not one of {known}")
    return Host(
        model=model,
        gpu_count=count,
        nvlink=bool(spec.get("nvlink", model.nvlink if model else False)),
        nics=tuple(spec.get("nics", ())),
        driver_version=str(spec.get("driver_version", "550.54.15")),
        cuda_version=str(spec.get("cuda_version", "12.4")),
        seed=str(spec.get("seed", root.resolve())),
        faults=_load_faults(root / "faults", count),
    )


def _indices(path: Path, gpu_count: int) -> frozenset[int]:
    if not path.exists():
        return frozenset()
    text = path.read_text().strip()
    if not text:
        return frozenset(range(gpu_count))
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SimulatorError(f"fault file {path} should hold GPU indices like '1,5', not {text!r}") from None


def _load_faults(folder: Path, gpu_count: int) -> Faults:
    garbage = folder / "nvidia_smi_garbage"
    return Faults(
        garbage=garbage.read_text() if garbage.exists() else None,
        driver_not_loaded=(folder / "driver_not_loaded").exists(),
        lost=_indices(folder / "gpu_lost", gpu_count),
        ecc=_indices(folder / "ecc_uncorrectable", gpu_count),
        hot=_indices(folder / "hot", gpu_count),
    )


# ---------------------------------------------------------------------------------------- GPU values


def _hash(host: Host, index: int, purpose: str) -> int:
    return int(hashlib.sha256(f"{host.seed}:{index}:{purpose}".encode()).hexdigest(), 16)


def gpu_uuid(seed: str, index: int) -> str:
    """Stable UUID of GPU `index` on the host with `seed`, formatted as nvidia-smi prints it."""
    h = hashlib.sha256(f"{seed}:{index}:uuid".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _bus(index: int) -> str:
    return _BUS_IDS[index] if index < len(_BUS_IDS) else f"{0xE0 + index:02X}"


def pci_bus_id(index: int) -> str:
    """`pci.bus_id` of GPU `index` ("00000000:18:00.0")."""
    return f"00000000:{_bus(index)}:00.0"


def _lost_line(index: int) -> str:
    return f"Unable to determine the device handle for GPU0000:{_bus(index)}:00.0: Unknown Error"


def _temperature_c(host: Host, index: int) -> int:
    return HOT_TEMPERATURE_C if index in host.faults.hot else 27 + _hash(host, index, "temp") % 10


def _power_w(host: Host, index: int) -> float:
    idle = host.model.max_power_w * (0.1 if host.model.ecc else 0.04)  # data-center vs consumer idle
    return round(idle + (_hash(host, index, "power") % 1000) / 100, 2)


def _values(host: Host, index: int) -> dict[str, str | int | float]:
    """Raw values of every QUERY_FIELDS column for one GPU ("[N/A]" where unsupported)."""
    model = host.model
    ecc: str | int = "[N/A]"
    if model.ecc:
        ecc = ECC_ERRORS_WHEN_FAULTY if index in host.faults.ecc else 0
    return {
        "index": index,
        "uuid": gpu_uuid(host.seed, index),
        "name": model.smi_name,
        "memory.total": model.memory_mib,
        "pci.bus_id": pci_bus_id(index),
        "temperature.gpu": _temperature_c(host, index),
        "utilization.gpu": 0,
        "memory.used": 1,
        "ecc.errors.uncorrected.volatile.total": ecc,
        "power.draw": f"{_power_w(host, index):.2f}",
    }


def _cell(field: str, value: str | int | float, units: bool) -> str:
    text = str(value)
    if units and field in _UNITS and not text.startswith("["):
        return f"{text} {_UNITS[field]}"
    return text


# -------------------------------------------------------------------------------------- nvidia-smi


def _parse_query_args(args: list[str]) -> tuple[list[str], set[str]]:
    """(fields, format options) of `--query-gpu=... --format=...`; ValueError says what is wrong."""
    options: dict[str, str] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        key, _, value = arg.partition("=")
        if key not in ("--query-gpu", "--format"):
            raise ValueError(_INVALID_ARGS)
        options[key] = value or (rest.pop(0) if rest else "")
    if "--format" not in options:
        raise ValueError('"--format" must be specified together with "--query-gpu".\n' + _INVALID_ARGS)
    fields = [f.strip() for f in options.get("--query-gpu", "").split(",") if f.strip()]
    for field in fields:
        if field not in QUERY_FIELDS:
            raise ValueError(f'Field "{field}" is not a valid field to query.\n\n')
    formats = {f.strip() for f in options["--format"].split(",")}
    if "csv" not in formats or formats - {"csv", "noheader", "nounits"} or not fields:
        raise ValueError(_INVALID_ARGS)
    return fields, formats


def _query(host: Host, args: list[str]) -> tuple[str, int]:
    try:
        fields, formats = _parse_query_args(args)
    except ValueError as error:
        return str(error), EXIT_INVALID_ARGUMENT
    if not host.gpu_count:
        return "No devices were found\n", EXIT_NO_DEVICES
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(f"{f} [{_UNITS[f]}]" if f in _UNITS else f for f in fields))
    for index in range(host.gpu_count):
        if index in host.faults.lost:
            lines.append(_lost_line(index))
            continue
        values = _values(host, index)
        lines.append(", ".join(_cell(f, values[f], "nounits" not in formats) for f in fields))
    return "\n".join(lines) + "\n", EXIT_GPU_LOST if host.faults.lost else 0


def _list_gpus(host: Host) -> tuple[str, int]:
    if not host.gpu_count:
        return "No devices were found\n", EXIT_NO_DEVICES
    lines = [
        _lost_line(i)
        if i in host.faults.lost
        else f"GPU {i}: {host.model.smi_name} (UUID: {gpu_uuid(host.seed, i)})"
        for i in range(host.gpu_count)
    ]
    return "\n".join(lines) + "\n", EXIT_GPU_LOST if host.faults.lost else 0


def _garbage(host: Host) -> str:
    if host.faults.garbage:
        return host.faults.garbage
    rng = random.Random(host.seed)
    # ASCII only (control characters included) so any reader's encoding decodes it; no commas or
    # newlines inside a line, so it can never pass for CSV rows.
    alphabet = "abcdefXYZ0123456789#$%&*+/:;<=>?@[]^_{|}~ \x01\x02\x07\x08\x0e\x1a\x7f"
    return "\n".join("".join(rng.choice(alphabet) for _ in range(72)) for _ in range(4)) + "\n"


# ------------------------------------------------------------------------------------------ topo -m


def _sockets(host: Host) -> int:
    return 2 if host.gpu_count >= 4 else 1


def _place(position: int, count: int, host: Host) -> tuple[int, int]:
    """(NUMA node, PCIe switch) of the position-th of `count` devices spread evenly over the board."""
    switches = host.gpu_count if host.nvlink or host.gpu_count < 4 else host.gpu_count // 2
    fraction = (position + 0.5) / count
    return int(fraction * _sockets(host)), int(fraction * switches)


def _pcie_link(a: tuple[int, int], b: tuple[int, int], host: Host) -> str:
    if a[1] == b[1]:
        return "PIX"
    if a[0] == b[0]:
        return "NODE" if _sockets(host) == 2 else "PHB"
    return "SYS"


def _cpu_affinity(host: Host, numa: int) -> str:
    if _sockets(host) == 1:
        return "0-31"
    cores = 56 if host.nvlink else 32  # per socket; hyper-threads numbered after all cores
    return f"{numa * cores}-{(numa + 1) * cores - 1},{(numa + 2) * cores}-{(numa + 3) * cores - 1}"


def _devices(host: Host) -> list[tuple[str, tuple[int, int]]]:
    gpus = [(f"GPU{i}", _place(i, host.gpu_count, host)) for i in host.present]
    nics = [(f"NIC{k}", _place(k, len(host.nics), host)) for k in range(len(host.nics))]
    return gpus + nics


def _topo_cell(a: tuple[str, tuple[int, int]], b: tuple[str, tuple[int, int]], host: Host) -> str:
    if a[0] == b[0]:
        return " X "
    if host.nvlink and a[0].startswith("GPU") and b[0].startswith("GPU"):
        if host.model.nvlink_pairs and int(a[0][3:]) // 2 != int(b[0][3:]) // 2:
            return _pcie_link(a[1], b[1], host)  # NVLink bridges join GPUs two by two only
        return f"NV{host.model.nvlink_links}"
    return _pcie_link(a[1], b[1], host)


def _topo(host: Host) -> tuple[str, int]:
    if not host.gpu_count:
        return "No devices were found\n", EXIT_NO_DEVICES
    devices = _devices(host)
    lines = ["\t" + "\t".join(name for name, _ in devices) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for device in devices:
        row = device[0] + "\t" + "\t".join(_topo_cell(device, other, host) for other in devices)
        if device[0].startswith("GPU"):
            numa = device[1][0]
            row += f"\t{_cpu_affinity(host, numa)}\t{numa}\t\tN/A"
        lines.append(row)
    text = "\n".join(lines) + "\n" + _LEGEND
    if host.nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{k}: {nic['name']}\n" for k, nic in enumerate(host.nics))
    return text, 0


# ------------------------------------------------------------------------------------ summary table


def _summary_rows(host: Host, index: int) -> list[str]:
    values, model = _values(host, index), host.model
    fan = "30%" if not model.ecc else "N/A"  # consumer cards have fans nvidia-smi can read
    ecc = str(values["ecc.errors.uncorrected.volatile.total"]).strip("[]")
    power = f"{_power_w(host, index):.0f}W / {model.max_power_w:>4}W"
    return [
        f"|{index:>4}  {model.smi_name[:26]:<26}{'On':>7}  |{pci_bus_id(index):>19} Off |{ecc:>21} |",
        f"| {fan:<5}{values['temperature.gpu']:>3}C    P0{power:>24} |"
        f"{values['memory.used']:>8}MiB / {model.memory_mib:>6}MiB |      0%      Default |",
        f"|{'':41}|{'':24}|{'Disabled' if model.ecc else 'N/A':>21} |",
        "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
    ]


def _timestamp(now: time.struct_time) -> str:
    return f"{time.strftime('%a %b', now)} {now.tm_mday:>2} {time.strftime('%H:%M:%S %Y', now)}"


def _summary(host: Host) -> tuple[str, int]:
    if host.faults.lost:
        return "".join(_lost_line(i) + "\n" for i in sorted(host.faults.lost)), EXIT_GPU_LOST
    if not host.gpu_count:
        return "No devices were found\n", EXIT_NO_DEVICES
    rule = "+" + "-" * 89 + "+"
    versions = f"NVIDIA-SMI {host.driver_version:<23}Driver Version: {host.driver_version:<15}"
    lines = [
        _timestamp(time.localtime()),
        rule,
        f"| {versions}CUDA Version: {host.cuda_version:<9}|",
        "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for index in range(host.gpu_count):
        lines += _summary_rows(host, index)
    return "\n".join(lines) + "\n", 0


def nvidia_smi(host: Host, args: list[str]) -> tuple[str, int]:
    """(stdout, exit status) of `nvidia-smi ARGS` on the simulated host."""
    if host.faults.driver_not_loaded:
        return DRIVER_NOT_LOADED_MESSAGE, EXIT_DRIVER_NOT_LOADED
    if host.faults.garbage is not None:
        return _garbage(host), 0
    if not args:
        return _summary(host)
    if args in (["-L"], ["--list-gpus"]):
        return _list_gpus(host)
    if args in (["topo", "-m"], ["topo", "--matrix"]):
        return _topo(host)
    if any(arg.startswith(("--query-gpu", "--format")) for arg in args):
        return _query(host, args)
    return _INVALID_ARGS, EXIT_INVALID_ARGUMENT


# ------------------------------------------------------------------------------------------- ibstat


def _ca_type(nic: dict) -> str:
    rate, ethernet = int(nic.get("rate_gbps", 400)), nic.get("link_layer", "InfiniBand") == "Ethernet"
    if rate >= 400:
        return "MT4129"  # ConnectX-7
    if rate >= 200:
        return "MT4125" if ethernet else "MT4123"  # ConnectX-6 Dx / ConnectX-6
    return "MT4125" if ethernet else "MT4119"  # ConnectX-6 Dx / ConnectX-5


def _ca_block(host: Host, number: int, nic: dict) -> str:
    name = nic["name"]
    guid = "0x" + hashlib.sha256(f"{host.seed}:{name}".encode()).hexdigest()[:16]
    ethernet = nic.get("link_layer", "InfiniBand") == "Ethernet"
    up = nic.get("state", "Active") == "Active"
    lid, sm_lid = ("0", "0") if ethernet else (str(number + 11), "1")
    return (
        f"CA '{name}'\n\tCA type: {_ca_type(nic)}\n\tNumber of ports: 1\n"
        f"\tFirmware version: 28.39.1002\n\tHardware version: 0\n\tNode GUID: {guid}\n"
        f"\tSystem image GUID: {guid}\n\tPort 1:\n"
        f"\t\tState: {'Active' if up else 'Down'}\n\t\tPhysical state: {'LinkUp' if up else 'Disabled'}\n"
        f"\t\tRate: {int(nic.get('rate_gbps', 400)) if up else 10}\n\t\tBase lid: {lid if up else 65535}\n"
        f"\t\tLMC: 0\n\t\tSM lid: {sm_lid}\n"
        f"\t\tCapability mask: {'0x00010000' if ethernet else '0xa651e848'}\n"
        f"\t\tPort GUID: {guid}\n\t\tLink layer: {'Ethernet' if ethernet else 'InfiniBand'}\n"
    )


def sysfs_tree(spec: dict) -> dict[str, str]:
    """Files of `/sys/class/infiniband` for the NICs of `spec` (path below the host root -> content).

    The same facts ibstat prints, in the kernel's formats ("4: ACTIVE", "400 Gb/sec (4X NDR)"); RoCE
    ports have RoCE GID types, plain Ethernet ports (`"roce": false`) none.
    """
    speeds = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 50: "2X HDR", 25: "1X EDR", 10: "4X SDR"}
    files: dict[str, str] = {}
    for nic in spec.get("nics", ()):
        port = f"sys/class/infiniband/{nic['name']}/ports/1"
        up = nic.get("state", "Active") == "Active"
        ethernet = nic.get("link_layer", "InfiniBand") == "Ethernet"
        rate = int(nic.get("rate_gbps", 400)) if up else 10
        files[f"{port}/state"] = "4: ACTIVE\n" if up else "1: DOWN\n"
        files[f"{port}/phys_state"] = "5: LinkUp\n" if up else "3: Disabled\n"
        files[f"{port}/rate"] = f"{rate} Gb/sec ({speeds.get(rate, '4X')})\n"
        files[f"{port}/link_layer"] = "Ethernet\n" if ethernet else "InfiniBand\n"
        if not ethernet:
            files[f"{port}/gid_attrs/types/0"] = "IB/RoCE v1\n"
        elif nic.get("roce", True):
            files[f"{port}/gid_attrs/types/0"] = "IB/RoCE v1\n"
            files[f"{port}/gid_attrs/types/1"] = "RoCE v2\n"
    return files


def ibstat(host: Host, args: list[str]) -> tuple[str, int]:
    """(stdout, exit status) of `ibstat [-l | CA_NAME]` on the simulated host."""
    if args == ["-l"]:
        return "".join(f"{nic['name']}\n" for nic in host.nics), 0
    chosen = [(n, nic) for n, nic in enumerate(host.nics) if not args or nic["name"] in args]
    if args and not chosen:
        missing = f"main: '{args[0]}' IB device can't be found: No such file or directory"
        return f"ibpanic: [{os.getpid()}] {missing}\n", 255
    return "".join(_ca_block(host, n, nic) for n, nic in chosen), 0


def main(argv: list[str]) -> int:
    """Entry point: `argv` is [tool, args...] with tool "nvidia-smi" or "ibstat"; returns the exit status."""
    tools = {"nvidia-smi": nvidia_smi, "ibstat": ibstat}
    if not argv or argv[0] not in tools:
        sys.stderr.write(f"usage: python -m inventory.drivers.simulator {{{'|'.join(tools)}}} [ARGS...]\n")
        return EXIT_INVALID_ARGUMENT
    root = os.environ.get("VOLT_HOST_ROOT")
    try:
        if not root:
            raise SimulatorError("VOLT_HOST_ROOT is not set")
        output, status = tools[argv[0]](load_host(Path(root)), argv[1:])
    except SimulatorError as error:
        sys.stderr.write(f"volt simulator: {error}\n")
        return EXIT_INVALID_ARGUMENT
    sys.stdout.buffer.write(output.encode("utf-8", "replace"))
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
