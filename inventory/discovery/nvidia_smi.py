"""Parse `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv[,noheader][,nounits]`.

Pure Python (no Django import). Real output looks like::

    index, uuid, name, memory.total [MiB], pci.bus_id, temperature.gpu, utilization.gpu [%], ...
    0, GPU-6f3b1c2e-..., NVIDIA H100 80GB HBM3, 81559 MiB, 00000000:18:00.0, 33, 0 %, ...

A GPU that fell off the bus is not a row but a line such as
"Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"; those are kept in
`GpuQuery.lost` so the caller can tell "7 GPUs" from "8 GPUs, one lost".
"""

from __future__ import annotations

import re
from collections.abc import Callable

from inventory.discovery.types import QUERY_FIELDS, GpuInfo, GpuQuery, ParseError
from inventory.gpu_catalog import canonical_model

# Values nvidia-smi prints where a field has no value on this GPU.
_MISSING = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error", ""}
_LOST_LINE = re.compile(r"^Unable to determine the device handle for\b", re.I)
_NO_DEVICES = re.compile(r"^No devices were found\.?$", re.I)
_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?)(?:\s*(?:MiB|MB|GiB|%|W|C|MHz))?$")
_HEADER_CELL = re.compile(r"^([a-z][a-z0-9_.]*)(?:\s*\[[^\]]*\])?$")
_REQUIRED = ("index", "uuid", "name")


def _line_ref(number: int, line: str) -> str:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return f"line {number}: {shown!r}"


def _missing(value: str) -> bool:
    return value.strip().lower() in _MISSING


def _number(value: str, field: str) -> float | None:
    if _missing(value):
        return None
    match = _NUMBER.match(value.strip())
    if not match:
        raise ValueError(f"expected a number for {field}, saw {value.strip()!r}")
    return float(match.group(1))


def _int(value: str, field: str) -> int | None:
    number = _number(value, field)
    return None if number is None else int(number)


def _text(value: str, field: str) -> str | None:
    return None if _missing(value) else value.strip()


# QUERY_FIELDS name -> (GpuInfo attribute, converter)
_COLUMNS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "index": ("index", _int),
    "uuid": ("uuid", _text),
    "name": ("name", _text),
    "memory.total": ("memory_total_mib", _int),
    "pci.bus_id": ("pci_bus_id", _text),
    "temperature.gpu": ("temperature_c", _int),
    "utilization.gpu": ("utilization_pct", _int),
    "memory.used": ("memory_used_mib", _int),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrectable", _int),
    "power.draw": ("power_draw_w", _number),
}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def _header_fields(line: str) -> list[str] | None:
    """The field names of a header line ("memory.total [MiB]" -> "memory.total"), else None."""
    names = []
    for cell in _cells(line):
        match = _HEADER_CELL.match(cell)
        if not match:
            return None
        names.append(match.group(1))
    return names if any(name in _COLUMNS for name in names) else None


def _check_header(fields: list[str], number: int, line: str) -> None:
    absent = [name for name in _REQUIRED if name not in fields]
    if absent:
        raise ParseError(
            f"nvidia-smi --query-gpu: expected a header with {', '.join(_REQUIRED)}; "
            f"{', '.join(absent)} missing in {_line_ref(number, line)}"
        )


def _gpu(fields: list[str], number: int, line: str) -> GpuInfo:
    cells = _cells(line)
    if len(cells) != len(fields):
        raise ParseError(
            f"nvidia-smi --query-gpu: expected {len(fields)} comma-separated values "
            f"({', '.join(fields)}), saw {len(cells)} in {_line_ref(number, line)}"
        )
    values: dict[str, object] = {}
    for field, cell in zip(fields, cells, strict=True):
        if field not in _COLUMNS:
            continue  # a column Volt did not ask for: harmless
        attribute, convert = _COLUMNS[field]
        try:
            values[attribute] = convert(cell, field)
        except ValueError as error:
            raise ParseError(f"nvidia-smi --query-gpu: {error} in {_line_ref(number, line)}") from None
    for field in _REQUIRED:
        if values.get(_COLUMNS[field][0]) is None:
            raise ParseError(
                f"nvidia-smi --query-gpu: expected a value for {field} in {_line_ref(number, line)}"
            )
    memory = values.get("memory_total_mib")
    return GpuInfo(
        model=canonical_model(str(values["name"]), memory if isinstance(memory, int) else None), **values
    )


def parse_query_gpu(text: str) -> GpuQuery:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` output.

    With a header, columns are taken from it (any order, units in brackets ignored); without one
    they are QUERY_FIELDS in order. "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]" become
    None. Lines about GPUs nvidia-smi could not reach go to `lost`. Empty output gives an empty
    GpuQuery; anything else that is not a GPU row raises ParseError naming the line.
    """
    fields: list[str] | None = None
    gpus: list[GpuInfo] = []
    lost: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or _NO_DEVICES.match(line):
            continue
        if _LOST_LINE.match(line):
            lost.append(line)
            continue
        if fields is None and not gpus:
            header = _header_fields(line)
            if header is not None:
                _check_header(header, number, line)
                fields = header
                continue
        gpus.append(_gpu(fields or list(QUERY_FIELDS), number, line))
    _check_unique(gpus)
    return GpuQuery(gpus=tuple(gpus), lost=tuple(lost))


def _check_unique(gpus: list[GpuInfo]) -> None:
    seen: set[int] = set()
    for gpu in gpus:
        if gpu.index in seen:
            raise ParseError(
                f"nvidia-smi --query-gpu: expected each GPU index once, saw index {gpu.index} twice"
            )
        seen.add(gpu.index)
