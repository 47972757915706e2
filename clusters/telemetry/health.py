"""Node health rules for the cluster watch (pure Python: no Django import, unit-tested alone).

A sweep reads each host of a cluster (`HostReading`) and the head's node list; `judge()` turns those
into a verdict and the one rule that fired, failures first: what a user needs to know is the worst.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inventory.discovery.types import GpuInfo

OK, WARNING, FAILED = "ok", "warning", "failed"


@dataclass(frozen=True)
class HostReading:
    """What one sweep learnt about one host through its driver."""

    reachable: bool
    error: str = ""  # why unreachable (driver message)
    gpus: tuple[GpuInfo, ...] = ()  # the node's GPUs only
    lost: tuple[str, ...] = ()  # nvidia-smi "Unable to determine the device handle" lines
    smi_error: str = ""  # nvidia-smi output could not be read
    ray_alive: bool = False  # this cluster's Ray node process runs on the host
    processes: int = 0


@dataclass(frozen=True)
class Limits:
    max_temp_c: int = 90
    warn_temp_c: int = 85


@dataclass(frozen=True)
class Judgement:
    verdict: str
    rule: str = ""
    readings: dict = field(default_factory=dict)


def judge(
    reading: HostReading,
    *,
    is_head: bool,
    head_error: str | None,
    head_state: str | None,
    limits: Limits = Limits(),  # noqa: B008 - frozen
    link: str = "",
) -> Judgement:
    """The verdict for one node.

    `head_error` is set when the head's node list could not be read (then the head node is failed and
    the other nodes are judged on their own readings); `head_state` is this node's state in that list
    ("ALIVE", "DEAD", or None when the head does not list it). `link`: why the cluster's latest
    bandwidth probe blames this host's link (a warning), or "".
    """
    readings = summarize(reading)
    rule = _failure(reading, is_head, head_error, head_state, limits)
    if rule:
        return Judgement(FAILED, rule, readings)
    rule = _warning(reading, limits) or link
    return Judgement(WARNING if rule else OK, rule, readings)


def _failure(
    reading: HostReading, is_head: bool, head_error: str | None, head_state: str | None, limits: Limits
) -> str:
    if not reading.reachable:
        return f"host unreachable: {reading.error}"
    if is_head and head_error:
        return f"Ray head not answering: {head_error}"
    if not reading.ray_alive:
        return "Ray node process not running on the host"
    if head_error is None and head_state != "ALIVE":
        return f"the head lists this node as {head_state or 'missing'}"
    if reading.lost:
        return f"GPU lost: {reading.lost[0]}"
    for gpu in reading.gpus:
        if gpu.ecc_uncorrectable:
            return f"GPU {gpu.index}: {gpu.ecc_uncorrectable} uncorrectable ECC errors"
    for gpu in reading.gpus:
        if gpu.temperature_c is not None and gpu.temperature_c > limits.max_temp_c:
            return f"GPU {gpu.index} at {gpu.temperature_c} C (limit {limits.max_temp_c} C)"
    return ""


def _warning(reading: HostReading, limits: Limits) -> str:
    if reading.smi_error:
        return f"nvidia-smi unreadable: {reading.smi_error}"
    for gpu in reading.gpus:
        if gpu.temperature_c is not None and gpu.temperature_c > limits.warn_temp_c:
            return f"GPU {gpu.index} at {gpu.temperature_c} C (warning above {limits.warn_temp_c} C)"
    return ""


def summarize(reading: HostReading) -> dict:
    """Per-host figures for samples and the console: hottest GPU, mean utilisation, memory and power sums."""
    gpus = reading.gpus
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    utils = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
    memory = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    power = [g.power_draw_w for g in gpus if g.power_draw_w is not None]
    figures = {
        "gpu_temp_c": max(temps) if temps else None,
        "gpu_util_pct": round(sum(utils) / len(utils), 1) if utils else None,
        "gpu_memory_used_mib": sum(memory) if memory else None,
        "gpu_power_w": round(sum(power), 1) if power else None,
    }
    per_gpu = [
        {"index": g.index, "temp_c": g.temperature_c, "util_pct": g.utilization_pct,
         "memory_used_mib": g.memory_used_mib, "power_w": g.power_draw_w, "ecc": g.ecc_uncorrectable}
        for g in gpus
    ]  # fmt: skip
    return {**figures, "gpus": per_gpu, "processes": reading.processes, "reachable": reading.reachable}
