"""Known GPU models: how nvidia-smi names them, their memory, and Volt's model names.

Pure Python (no Django import): the parsers and the `local` driver's simulator use it too.

Volt names the variant that matters for a job, not only the family: A100-40GB / A100-80GB, and
H100-SXM / H100-PCIe / H100-NVL. A request may name a family ("A100": every memory size) or a
variant ("A100-80GB": that one only); `model_matches` is the one rule, used by offers filters and
by placement. A model Volt does not know keeps nvidia-smi's name, normalised ("NVIDIA GeForce RTX
3090" -> "RTX 3090").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    model: str  # Volt's precise model name, used in requests, offers and filters
    smi_name: str  # what nvidia-smi prints in the `name` column
    memory_mib: int
    nvlink: bool  # whether the model has NVLink between GPUs of one host
    nvlink_links: int  # NV# printed by `topo -m` between two NVLink-connected GPUs
    max_power_w: int
    ecc: bool  # consumer GPUs print [N/A] for ECC counters
    family: str = ""  # "A100" for A100-40GB and A100-80GB; "" when the model is its own family
    nvlink_pairs: bool = False  # NVLink bridges join GPUs two by two (H100 NVL), not an NVSwitch


CATALOG: tuple[GpuModel, ...] = (
    GpuModel("H100-SXM", "NVIDIA H100 80GB HBM3", 81559, True, 18, 700, True, "H100"),
    GpuModel("H100-NVL", "NVIDIA H100 NVL", 95830, True, 6, 400, True, "H100", nvlink_pairs=True),
    GpuModel("H100-PCIe", "NVIDIA H100 PCIe", 81559, False, 0, 350, True, "H100"),
    GpuModel("H200", "NVIDIA H200", 143771, True, 18, 700, True),
    GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, True, 12, 400, True, "A100"),
    GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, True, 12, 400, True, "A100"),
    GpuModel("L40S", "NVIDIA L40S", 46068, False, 0, 350, True),
    GpuModel("RTX 4090", "NVIDIA GeForce RTX 4090", 24564, False, 0, 450, False),
)
# A family name stands for its most common variant where one model must be chosen (a local host's
# spec, a demo inventory): "H100" -> H100-SXM, "A100" -> A100-80GB.
FAMILY_DEFAULT = {"H100": "H100-SXM", "A100": "A100-80GB"}
BY_MODEL: dict[str, GpuModel] = {m.model: m for m in CATALOG}
BY_MODEL.update({family: BY_MODEL[model] for family, model in FAMILY_DEFAULT.items()})
FAMILIES = frozenset(m.family for m in CATALOG if m.family)

_A100_80GB_MIN_MIB = 60_000  # between the 40 GB (40960 MiB) and 80 GB (81920 MiB) boards
_PREFIXES = re.compile(r"^(?:NVIDIA\s+)?(?:GeForce\s+|Tesla\s+)?", re.I)


def _h100(name: str, memory_mib: int | None) -> str:
    if re.search(r"\bNVL\b", name, re.I):
        return "H100-NVL"
    if re.search(r"\bPCIe\b", name, re.I):
        return "H100-PCIe"
    return "H100-SXM"  # "H100 80GB HBM3" / "H100 SXM5 ..." boards


def _a100(name: str, memory_mib: int | None) -> str:
    if re.search(r"80\s*GB", name, re.I):
        return "A100-80GB"
    if re.search(r"40\s*GB", name, re.I):
        return "A100-40GB"
    if memory_mib:
        return "A100-80GB" if memory_mib >= _A100_80GB_MIN_MIB else "A100-40GB"
    return "A100"


_PATTERNS = [
    (re.compile(r"\bH200\b", re.I), lambda name, memory: "H200"),
    (re.compile(r"\bH100\b", re.I), _h100),
    (re.compile(r"\bA100\b", re.I), _a100),
    (re.compile(r"\bL40S\b", re.I), lambda name, memory: "L40S"),
    (re.compile(r"\bRTX\s*4090\b", re.I), lambda name, memory: "RTX 4090"),
]


def normalized_name(smi_name: str) -> str:
    """nvidia-smi's name without vendor prefixes and extra spaces ("NVIDIA GeForce  RTX 3090" -> "RTX 3090")."""
    return " ".join(_PREFIXES.sub("", smi_name.strip()).split())


def canonical_model(smi_name: str, memory_mib: int | None = None) -> str:
    """Volt's precise model for a name nvidia-smi printed ("NVIDIA A100-SXM4-40GB" -> "A100-40GB").

    Memory decides where the name does not (an A100 PCIe board printed without its size).
    """
    for pattern, model in _PATTERNS:
        if pattern.search(smi_name):
            return model(smi_name, memory_mib)
    return normalized_name(smi_name)


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", " ", name.strip()).upper()


def model_matches(requested: str, precise: str) -> bool:
    """Whether a host of model `precise` serves a request for `requested`.

    The same name matches (case and spacing aside); a family matches each of its variants
    ("A100" matches "A100-40GB" and "A100-80GB"; "A100-80GB" matches only itself).
    """
    want, have = _key(requested), _key(precise)
    if want == have:
        return True
    return want in FAMILIES and have.startswith(want + "-")


def matching_models(requested: Iterable[str], offered: Iterable[str]) -> tuple[str, ...]:
    """The offered models each requested name matches, in request order (each model once).

    A requested name that matches nothing offered is kept as written, so the caller can say it is unknown.
    """
    offered = sorted(set(offered))
    result: list[str] = []
    for name in requested:
        found = [model for model in offered if model_matches(name, model)] or [name]
        result += [model for model in found if model not in result]
    return tuple(result)


def catalog_matches(requested: str) -> tuple[str, ...]:
    """`requested` and every catalog model it matches (for SQL filters: "A100" -> A100, A100-80GB, A100-40GB)."""
    return (requested.strip(), *[m.model for m in CATALOG if model_matches(requested, m.model)])


def memory_gib(memory_mib: int | None) -> int | None:
    """A board's memory in GiB, rounded ("81559 MiB" -> 80), as offers show it."""
    return round(memory_mib / 1024) if memory_mib else None
