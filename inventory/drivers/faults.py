"""The faults a `local` host can be given: one table, read by the driver, the add-host form and its checks.

Each entry says what the fault does, whether it takes a value (and its range), which host kinds it
means something on, and whether this machine can inject it at all. A fault is offered only where it
works: `ecc_uncorrectable` needs GPUs with ECC memory (an RTX 4090 has none, so its ECC counters read
[N/A] and there is nothing to corrupt), `throttled` needs a writable CPU cgroup. Adding a fault is one
entry here plus what makes it happen (the simulator or the driver reading `faults/<name>`).

Pure Python (no Django): the driver and the simulator import it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inventory.fabric_emulation import unavailable_reason
from inventory.gpu_catalog import BY_MODEL


@dataclass(frozen=True)
class HostKind:
    """What a fault may depend on: the host's GPU model and its fabric kind (inventory.choices.FabricKind)."""

    gpu_model: str
    fabric_kind: str = ""

    @property
    def has_ecc(self) -> bool:
        model = BY_MODEL.get(self.gpu_model)
        return bool(model and model.ecc)


@dataclass(frozen=True)
class FaultValue:
    """The value a fault takes: an integer in [minimum, maximum], written into its fault file."""

    label: str
    minimum: int
    maximum: int
    default: int
    hint: str = "a number"  # what to write, in a refusal: "a CPU percentage"


class FaultValueRefused(ValueError):
    """A value this fault cannot take; the message says what it takes (API: 400 on `value`)."""

    field = "value"


_GPU_INDICES = re.compile(r"^\d{1,4}(,\d{1,4})*$")
_WHOLE_NUMBER = re.compile(r"^\d{1,6}$")
MAX_FREE_TEXT = 1000


# A check answers None when the fault can be used, else why not (shown to the user).
KindCheck = Callable[[HostKind], "str | None"]
MachineCheck = Callable[[], "str | None"]


def _any_kind(kind: HostKind) -> str | None:
    return None


def _needs_ecc(kind: HostKind) -> str | None:
    return None if kind.has_ecc else f"{kind.gpu_model} GPUs have no ECC memory, so they report no ECC errors"


def _needs_cpu_cgroup() -> str | None:
    v2 = Path("/sys/fs/cgroup")
    root = v2 if (v2 / "cgroup.controllers").exists() else v2 / "cpu"  # as the driver picks it
    if root.is_dir() and os.access(root, os.W_OK):
        return None
    return "this machine gives Volt no writable CPU cgroup (run as root or delegate the cpu controller)"


def _needs_infiniband(kind: HostKind) -> str | None:
    if kind.fabric_kind.startswith("ib_"):
        return None
    return "only hosts on an InfiniBand fabric can fall back from InfiniBand to Ethernet"


def _needs_emulated_links() -> str | None:
    # Link faults change the shaping of local links (inventory/fabric_emulation.py): without it they
    # would silently do nothing. Django's settings are read here only (this module stays importable without).
    from django.conf import settings

    return unavailable_reason(settings.VOLT_LOCAL_FABRIC_EMULATION)


@dataclass(frozen=True)
class Fault:
    """One injectable fault (see the module docstring)."""

    name: str
    description: str
    value: FaultValue | None = None
    applies_to: KindCheck = _any_kind
    machine_check: MachineCheck | None = None
    at_creation_only: bool = False  # shapes the sandbox itself (no file to add later)
    fixed_content: str = ""  # the file's content when the fault takes no value
    gpu_indices: bool = False  # the file may name GPUs ("1,3"; empty: every GPU) instead of its fixed content
    free_text: bool = False  # the file holds any text (what a broken nvidia-smi prints)

    @property
    def label(self) -> str:
        """The fault as every form, page, message and the API name it ("nvidia_smi_garbage"): the walk found
        "nvidia smi garbage" in one place and "nvidia_smi_garbage" in the next."""
        return self.name

    def problem(self, kind: HostKind, value: int | None = None) -> tuple[str, str] | None:
        """(field, message) saying why this fault cannot be injected as asked, or None when it can."""
        why = self.applies_to(kind) or (self.machine_check() if self.machine_check else None)
        if why:
            return "fault", f"{self.label} cannot be injected here: {why}."
        if self.value is None:
            return None
        if value is None:
            return "fault_value", f"{self.label} needs a value: {self.value.label}."
        if not self.value.minimum <= value <= self.value.maximum:
            return "fault_value", (
                f"{self.value.label} must lie between {self.value.minimum} and {self.value.maximum}."
            )
        return None

    def check_value(self, raw: str, gpu_count: int) -> str:
        """The fault file's content for `raw` as a person gave it (API, console, drill), or FaultValueRefused
        saying what this fault takes. Empty is always accepted (each fault's default)."""
        text = raw.strip()
        if not text:
            return ""
        if self.value is not None:
            low, high = self.value.minimum, self.value.maximum
            if not _WHOLE_NUMBER.match(text) or not low <= int(text) <= high:
                raise FaultValueRefused(
                    f"{self.name} takes {self.value.label}, a whole number: write {self.value.hint} from "
                    f"{low} to {high}, not {text[:20]!r}."
                )
            return str(int(text))
        if self.gpu_indices:
            indices = [int(part) for part in text.split(",")] if _GPU_INDICES.match(text) else None
            if indices is None or not gpu_count or max(indices) >= gpu_count:
                raise FaultValueRefused(
                    f"{self.name} takes GPU indices from 0 to {max(gpu_count - 1, 0)}, like 0 or 0,1 (empty: "
                    f"every GPU), not {text[:20]!r}."
                )
            return ",".join(str(i) for i in sorted(set(indices)))
        if self.free_text:
            if len(raw) > MAX_FREE_TEXT or "\x00" in raw:
                raise FaultValueRefused(f"{self.name} takes text of at most {MAX_FREE_TEXT} characters.")
            return raw
        raise FaultValueRefused(f"{self.name} takes no value; leave value empty.")

    def content(self, value: int | None = None) -> str:
        """What goes into `faults/<name>` of the sandbox."""
        if self.value is None:
            return self.fixed_content
        return str(self.value.default if value is None else value)


CATALOG: tuple[Fault, ...] = (
    Fault("unreachable", "every command fails as if the host were down"),
    Fault("nvidia_smi_garbage", "nvidia-smi prints something that is not its real output", free_text=True),
    Fault("nvidia_smi_missing", "no nvidia-smi on the host (driver not installed)", at_creation_only=True),
    Fault("ibstat_missing", "no ibstat on the host (ports are read from /sys/class/infiniband)", at_creation_only=True),
    Fault("driver_not_loaded", "nvidia-smi cannot talk to the NVIDIA driver (exits 9 with NVIDIA's message)"),
    Fault("gpu_lost", "GPU 0 fell off the bus", fixed_content="0", gpu_indices=True),
    Fault("ecc_uncorrectable", "GPU 0 reports uncorrectable ECC errors", applies_to=_needs_ecc, fixed_content="0",
          gpu_indices=True),
    Fault("hot", "GPU 0 runs at 96 C", fixed_content="0", gpu_indices=True),
    Fault("partitioned", "the host cannot reach other hosts (its Ray worker never joins)"),
    Fault(
        "throttled",
        "the host runs at a share of one CPU: onboards fine, then the cluster probe finds it slow",
        value=FaultValue("CPU share (% of one core)", 1, 100, 20, hint="a CPU percentage"),
        machine_check=_needs_cpu_cgroup,
    ),
    Fault(
        "link_degraded",
        "the host's links run at a share of their rate (emulated fabric)",
        value=FaultValue("link rate (% of declared)", 1, 100, 50, hint="a percentage of the link rate"),
        machine_check=_needs_emulated_links,
    ),
    Fault("link_flapping", "the host's links go down and up every few seconds", machine_check=_needs_emulated_links),
    Fault(
        "ib_fallback",
        "the host's links drop to the Ethernet class's rate (silent InfiniBand-to-TCP fallback)",
        applies_to=_needs_infiniband,
        machine_check=_needs_emulated_links,
    ),
)  # fmt: skip
BY_NAME = {fault.name: fault for fault in CATALOG}
NAMES = tuple(BY_NAME)
