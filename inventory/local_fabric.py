"""This install's emulated fabric (DESIGN.md "Emulated fabric"): whether links are shaped, keeping the
shaping in step with the local hosts, and injecting or clearing faults on local hosts.

The machine side (tc classes, the source-address shim, the flapping process) is
inventory/fabric_emulation.py; this module reads the database and the hosts' fault files and calls it.
`inventory.services` re-exports what other apps use.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from django.conf import settings
from django.db import transaction

from inventory import drill_records
from inventory import fabric_emulation as fe
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.drivers import faults as fault_table
from inventory.drivers.base import DriverError
from inventory.drivers.local import LINK_FAULTS, clear_fault, creation_faults, percent_value, set_fault
from inventory.models import Host, HostEvent

logger = logging.getLogger(__name__)
_SHAPED_STATES_EXCLUDED = (HostState.RETIRED, HostState.FAILED)


def unavailable_reason() -> str | None:
    """Why local links are not emulated here, or None when they are shaped."""
    return fe.unavailable_reason(settings.VOLT_LOCAL_FABRIC_EMULATION)


def links_emulated() -> bool:
    return unavailable_reason() is None


def bandwidth_scale(driver: str) -> float:
    """What a host's declared figures are multiplied by in predictions: the emulation's scale on local hosts
    whose links are shaped, 1 everywhere else."""
    if driver == DriverKind.LOCAL and links_emulated():
        return settings.VOLT_LOCAL_FABRIC_SCALE
    return 1.0


def preload() -> Path | None:
    """The source-address shim local hosts' processes run with, when links are shaped."""
    if not links_emulated():
        return None
    try:
        return fe.shim_path()
    except fe.EmulationUnavailable:
        logger.warning("local links cannot be emulated", exc_info=True)
        return None


def sandbox_path(host: Host) -> Path:
    """The folder that is a local host: its files, its simulated tools, its fault files."""
    return Path(settings.VOLT_DATA_DIR) / "hosts" / f"{host.provider.slug}-{host.pk}"


def _state_dir() -> Path:
    return Path(settings.VOLT_DATA_DIR)


def _sandbox(host: Host) -> Path:
    return sandbox_path(host)


def _injection_gbps(host: Host) -> float:
    """The fabric's declared per-host figure, or the host's ports' where they give less: the wire runs at
    what placement predicts (clusters.placement.HostSnapshot.injection_gbps)."""
    declared, ports = host.fabric.per_host_gbytes_per_s, host.discovered_gbytes_per_s
    return declared if ports is None else min(declared, ports)


def _link_end(host: Host) -> fe.LinkEnd:
    faults = _sandbox(host) / "faults"
    degraded = 100.0
    if (faults / "link_degraded").exists():
        try:
            degraded = percent_value("link_degraded", (faults / "link_degraded").read_text())
        except DriverError:
            logger.warning("host %s: ignoring an unreadable link_degraded fault", host.pk)
    return fe.LinkEnd(
        address=host.address,
        path=(host.site.region, str(host.site_id), str(host.fabric_id), str(host.block_id)),
        fabric_gbps=_injection_gbps(host),
        oversubscription=host.fabric.oversubscription,
        declared_gbps=host.fabric.per_host_gbytes_per_s,
        backbone_gbps=host.site.backbone_gbytes_per_s,
        degraded_pct=degraded,
        ib_fallback=(faults / "ib_fallback").exists(),
    )


def sync(strict: bool = False) -> fe.InstallState | None:
    """Shape this install's local links as the database and fault files say now (idempotent).

    Called when a local host is onboarded, retired or fails, when a fault changes, and by the health
    sweep (fault files written by hand). With emulation off, removes whatever an earlier run shaped.
    Shaping that fails is logged; `strict` raises fe.EmulationUnavailable instead (a link fault must not
    be reported injected when it cannot act).
    """
    if not links_emulated():
        if fe.read_state(_state_dir()) is not None:
            fe.remove(_state_dir())
        return None
    hosts = list(
        Host.objects.filter(driver=DriverKind.LOCAL)
        .exclude(state__in=_SHAPED_STATES_EXCLUDED)
        .select_related("site", "fabric", "provider")
        .order_by("pk")
    )
    hosts = [h for h in hosts if _sandbox(h).is_dir()]
    try:
        state = fe.apply(_state_dir(), [_link_end(h) for h in hosts], settings.VOLT_LOCAL_FABRIC_SCALE)
    except fe.EmulationUnavailable:
        if strict:
            raise
        logger.warning("shaping local links failed", exc_info=True)
        return None
    for host in hosts:
        _keep_flapping(host)
    return state


def remove_all() -> None:
    """Remove whatever this install shaped (the demo on its way out; tests)."""
    for host in Host.objects.filter(driver=DriverKind.LOCAL).select_related("provider"):
        fe.stop_flapping(_sandbox(host) / "faults" / "link_flapping")
    fe.remove(_state_dir())


def sync_after_commit() -> None:
    transaction.on_commit(sync)


def _keep_flapping(host: Host) -> None:
    fault_file = _sandbox(host) / "faults" / "link_flapping"
    if not fault_file.exists():
        fe.stop_flapping(fault_file)
        return
    pid_file = fault_file.with_name(".link_flapping.pid")
    try:
        os.kill(int(pid_file.read_text()), 0)
        return  # already flapping
    except (OSError, ValueError):
        pass
    fe.start_flapping(
        _state_dir(),
        host.address,
        fault_file,
        settings.VOLT_LINK_FLAP_PERIOD_S,
        settings.VOLT_LINK_FLAP_MAX_S,
    )


def fault_value(host: Host, fault: str, value: str) -> str:
    """`value` as the content of `fault`'s file on `host`, or FaultValueRefused saying what the fault takes
    (its range, GPU indices of this host, or nothing): "1;id", "99" or "-1" are never written."""
    known = fault_table.BY_NAME.get(fault)
    if known is None:
        raise ValueError(f"unknown fault {fault!r}: choose one of {', '.join(fault_table.NAMES)}")
    gpu_count = host.gpu_count or int((host.local_spec or {}).get("gpu_count") or 0)
    return known.check_value(value, gpu_count)


def inject_fault(host: Host, fault: str, value: str = "", actor=None, drill=None) -> None:
    """Inject a fault into a local host (API, console, tests, drills); link faults reshape its links at once.

    `drill` (an inventory.models.HostDrill): a fault drill injects it, and takes it back when its cluster
    ends; injected by hand where a drill holds it, the fault is real from now on and stays.
    FaultValueRefused (a value the fault does not take: `fault_value`), ValueError (unknown fault, not a
    local host, a link fault whose shaping fails: the fault is taken back) or DriverError."""
    if host.driver != DriverKind.LOCAL:
        raise ValueError("faults can be injected into local hosts only")
    value = fault_value(host, fault, value)
    sandbox = _sandbox(host)
    set_fault(sandbox, fault, value)
    if fault in LINK_FAULTS and links_emulated():
        try:
            sync(strict=True)
        except fe.EmulationUnavailable as exc:
            clear_fault(sandbox, fault)
            raise ValueError(f"{fault} cannot act: shaping the links failed ({exc})") from None
    if drill is None:
        drill_records.fault_adopted(host, fault)
    by = f" by a fault drill of cluster {drill.cluster_pk}" if drill is not None else ""
    _record(host, f"fault injected{by}: {fault}{f' ({value})' if value else ''}", actor, drill)


def clear_host_fault(host: Host, fault: str, actor=None, reason: str = "") -> None:
    """Clear a fault of a local host; link faults give its links their rate back at once. No drill holds it
    any more (`reason`: why, on the host's history)."""
    if host.driver != DriverKind.LOCAL:
        raise ValueError("faults can be cleared on local hosts only")
    if fault in fault_table.BY_NAME and fault_table.BY_NAME[fault].at_creation_only:
        raise ValueError(f"{fault} was set when the host was added and cannot be cleared: add the host again")
    sandbox = _sandbox(host)
    if fault == "link_flapping":
        fe.stop_flapping(sandbox / "faults" / "link_flapping")
    clear_fault(sandbox, fault)
    drill_records.fault_cleared(host, fault)
    _record(host, f"fault cleared: {fault}{f' ({reason})' if reason else ''}", actor)
    if fault in LINK_FAULTS:
        sync_after_commit()


def link_faults(host: Host) -> list[str]:
    """The link faults a local host carries now, as "name:value" ("name" for those without a value)."""
    return [
        f"{name}:{value}" if value else name
        for name, value in active_faults(host).items()
        if name in LINK_FAULTS
    ]


def active_faults(host: Host) -> dict[str, str]:
    """The faults a local host carries now: name -> the file's content ("" for the faults it was added
    with that leave no file, e.g. nvidia_smi_missing: its sandbox has no nvidia-smi)."""
    sandbox = _sandbox(host)
    faults = sandbox / "faults"
    if host.driver != DriverKind.LOCAL or not faults.is_dir():
        return {}
    found = {
        path.name: path.read_text().strip() for path in faults.iterdir() if not path.name.startswith(".")
    }
    found.update(dict.fromkeys(creation_faults(sandbox), ""))
    return dict(sorted(found.items()))


def _record(host: Host, message: str, actor, drill=None) -> None:
    HostEvent.objects.create(
        host=host,
        kind=HostEventKind.HEALTH,
        message=message,
        actor=actor if actor is not None and actor.is_authenticated else None,
        drill=drill,
    )
