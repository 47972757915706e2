"""Parse `nvidia-smi topo -m`: how each pair of GPUs and NICs in a host is connected.

Pure Python (no Django import). Real output is tab-separated (here shown with spaces), often
with trailing tabs and an empty cell before `GPU NUMA ID`::

            GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV18    PIX     0-55,112-167    0               N/A
    GPU1    NV18     X      NODE    0-55,112-167    0               N/A
    NIC0    PIX     NODE     X

    Legend:
      ...
    NIC Legend:
      NIC0: mlx5_0

Older drivers name NICs by device (`mlx5_0`) in the matrix and print no NIC legend, nor the
`GPU NUMA ID` column. Cells are split on any whitespace, so space-separated copies parse too.
"""

from __future__ import annotations

import re

from inventory.discovery.types import ParseError, TopoMatrix

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_GPU = re.compile(r"^GPU\d+$")
_NIC_ALIAS = re.compile(r"^NIC\d+$")
_DEVICE = re.compile(r"^[A-Za-z][\w.-]*$")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NIC_LEGEND = re.compile(r"^(NIC\d+)\s*:\s*(\S+)$")
_EXPECTED_HEADER = "the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... [CPU Affinity ...])"


def _line_ref(number: int, line: str) -> str:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return f"line {number}: {shown!r}"


def _header(number: int, line: str) -> tuple[list[str], list[str]]:
    """Device names and affinity column labels of the header row."""
    # Affinity columns are optional: some drivers (and VMs without NUMA information) print none.
    found = [line.find(c) for c in _AFFINITY_COLUMNS if c in line]
    at = min(found) if found else len(line)
    devices = line[:at].split()
    if not any(_GPU.match(d) for d in devices) or not all(_DEVICE.match(d) for d in devices):
        raise ParseError(f"nvidia-smi topo -m: expected {_EXPECTED_HEADER}, saw {_line_ref(number, line)}")
    if len(set(devices)) != len(devices):
        raise ParseError(
            f"nvidia-smi topo -m: expected each device once in the header, saw {_line_ref(number, line)}"
        )
    columns = sorted((c for c in _AFFINITY_COLUMNS if c in line[at:]), key=line.find)
    return devices, columns


def _row(devices: list[str], columns: list[str], number: int, line: str) -> tuple[str, list[str], list[str]]:
    """(device, its cells in header order, its affinity values) for one matrix row."""
    tokens = line.split()
    name, cells, rest = tokens[0], tokens[1 : 1 + len(devices)], tokens[1 + len(devices) :]
    if name not in devices:
        raise ParseError(
            f"nvidia-smi topo -m: expected a row for one of {' '.join(devices)}, "
            f"saw {_line_ref(number, line)}"
        )
    bad = [cell for cell in cells if not _CELL.match(cell)]
    if len(cells) != len(devices) or bad or cells[devices.index(name)] != "X" or len(rest) > len(columns):
        raise ParseError(
            f"nvidia-smi topo -m: expected {len(devices)} cells (X, NV#, PIX, PXB, PHB, NODE or SYS, "
            f"X on the diagonal) then up to {len(columns)} affinity values, saw {_line_ref(number, line)}"
        )
    return name, cells, rest


def _sections(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """Numbered non-blank matrix lines (before "Legend:") and the NIC legend lines."""
    matrix: list[tuple[int, str]] = []
    nic_legend: list[str] = []
    section = "matrix"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _ANSI.sub("", raw).strip()
        if line in ("Legend:", "NIC Legend:"):
            section = line
        elif line and section == "matrix":
            matrix.append((number, line))
        elif line and section == "NIC Legend:":
            nic_legend.append(line)
    return matrix, nic_legend


def _nic_names(nics: list[str], legend: list[str]) -> dict[str, str]:
    names = {nic: nic for nic in nics if not _NIC_ALIAS.match(nic)}  # older drivers: mlx5_0 itself
    for line in legend:
        match = _NIC_LEGEND.match(line)
        if match and match.group(1) in nics:
            names[match.group(1)] = match.group(2)
    return names


def parse_topo(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -m` output into a TopoMatrix; ParseError names the line it could not read."""
    matrix, legend = _sections(text)
    if not matrix:
        raise ParseError(f"nvidia-smi topo -m: expected {_EXPECTED_HEADER}, saw empty output")
    devices, columns = _header(*matrix[0])
    links: dict[tuple[str, str], str] = {}
    affinity: dict[str, dict[str, str]] = {column: {} for column in _AFFINITY_COLUMNS}
    seen: set[str] = set()
    for number, line in matrix[1:]:
        name, cells, rest = _row(devices, columns, number, line)
        seen.add(name)
        links.update(
            {(name, other): cell for other, cell in zip(devices, cells, strict=True) if other != name}
        )
        for column, value in zip(columns, rest, strict=False):
            affinity[column][name] = value
    gpus = [d for d in devices if _GPU.match(d)]
    missing = [gpu for gpu in gpus if gpu not in seen]
    if missing:
        raise ParseError(
            f"nvidia-smi topo -m: expected a row for each GPU in the header, {' '.join(missing)} missing"
        )
    nics = [d for d in devices if not _GPU.match(d)]
    return TopoMatrix(
        gpus=tuple(gpus),
        nics=tuple(nics),
        nic_names=_nic_names(nics, legend),
        links=links,
        cpu_affinity=affinity["CPU Affinity"],
        numa_affinity=affinity["NUMA Affinity"],
        gpu_numa_id=affinity["GPU NUMA ID"],
    )
