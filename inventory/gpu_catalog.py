"""Known GPU models: how nvidia-smi names them, their memory, and Volt's short model names.

Pure Python (no Django import): the parsers and the `local` driver's simulator use it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    model: str  # short name Volt uses in requests and filters
    smi_name: str  # what nvidia-smi prints in the `name` column
    memory_mib: int
    nvlink: bool  # whether the model has NVLink between GPUs of one host
    nvlink_links: int  # NV# printed by `topo -m` between two GPUs of an NVSwitch host
    max_power_w: int
    ecc: bool  # consumer GPUs print [N/A] for ECC counters


CATALOG: tuple[GpuModel, ...] = (
    GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559, True, 18, 700, True),
    GpuModel("H200", "NVIDIA H200", 143771, True, 18, 700, True),
    GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920, True, 12, 400, True),
    GpuModel("L40S", "NVIDIA L40S", 46068, False, 0, 350, True),
    GpuModel("RTX 4090", "NVIDIA GeForce RTX 4090", 24564, False, 0, 450, False),
)
BY_MODEL = {m.model: m for m in CATALOG}

# Longest pattern first, so "H100" does not swallow "H100 NVL" variations etc.
_PATTERNS = [
    (re.compile(r"\bH200\b", re.I), "H200"),
    (re.compile(r"\bH100\b", re.I), "H100"),
    (re.compile(r"\bA100\b", re.I), "A100"),
    (re.compile(r"\bL40S\b", re.I), "L40S"),
    (re.compile(r"\bRTX\s*4090\b", re.I), "RTX 4090"),
]


def canonical_model(smi_name: str) -> str:
    """Volt's short model for a name nvidia-smi printed ("NVIDIA A100-SXM4-40GB" -> "A100")."""
    for pattern, model in _PATTERNS:
        if pattern.search(smi_name):
            return model
    return smi_name.strip()
