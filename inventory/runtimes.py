"""Volt's runtime on SSH hosts, as the inventory keeps it (`Host.runtime`): installing it after onboarding,
its progress on the host page, checking it before a cluster, bringing it up to date when Volt's pins move.

The work on the host is inventory/host_runtime.py's; this module records it. The rules:

- An SSH host joins the pool (offers, placement: `services.offerable_hosts`) once its runtime of Volt's
  current key is ready; onboarding queues the install, which runs in the background with its step shown.
- When Volt's pins change (an upgrade of Volt), a host's record no longer names the current key: idle
  hosts are brought up to date in the background (`refresh_runtimes`, periodic), busy ones after their
  cluster ends (their clusters keep running on the runtime they started with; the record says "waiting").
- Before every cluster, provisioning checks the runtime on each SSH node again (`check_nodes`): a host
  whose runtime no longer matches is refused with what to do, and reinstalled when idle.
"""

from __future__ import annotations

import logging
import time

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q
from django.utils import timezone

from inventory import host_runtime
from inventory import services as inventory
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.drivers.base import DriverError, fan_out
from inventory.models import GPU, Host
from inventory.transitions import note_host
from voltweb import realtime
from voltweb.domain import DomainError
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)

TASK = "inventory.tasks.install_runtime_task"
# Hosts whose runtime Volt keeps: reachable over SSH, not given up on.
KEPT_STATES = (HostState.AVAILABLE, HostState.DRAINING, HostState.CORDONED)
PROGRESS_EVERY_S = 1.0


class RuntimeRefused(DomainError):
    """An install asked for where there is nothing to install (a local host) or not now (the host's state)."""

    code = "runtime_refused"


def needs_runtime(host: Host) -> bool:
    """Local hosts share this machine's local runtime (inventory/local_runtime.py); SSH hosts have their own."""
    return host.driver == DriverKind.SSH


def is_ready(host: Host) -> bool:
    record = host.runtime or {}
    return bool(record.get("ready")) and record.get("key") == host_runtime.key()


def busy(host: Host) -> bool:
    return GPU.objects.filter(host=host, allocations__active=True).exists()


def stale_q() -> Q:
    """SSH hosts whose recorded runtime is not a ready one of Volt's current key."""
    return ~inventory.runtime_ready_q()


def summary(record: dict) -> str:
    """ "ray 2.60.0, torch 2.13.0+cpu, numpy 2.4.6 on Python 3.11" (what the host page shows)."""
    versions = record.get("versions") or {}
    held = ", ".join(f"{name} {versions.get(name) or 'missing'}" for name in host_runtime.PINNED)
    return f"{held} on Python {record.get('python_version') or '?'}"


def _save(host: Host, record: dict) -> None:
    record = record | {"checked_at": timezone.now().isoformat()}
    Host.objects.filter(pk=host.pk).update(runtime=record, updated_at=timezone.now())
    host.runtime = record
    realtime.broadcast(f"host-{host.pk}", {"kind": "runtime", "runtime": record})


def queue_install(host: Host, actor: AbstractBaseUser | None = None) -> Host:
    """Ask a worker to install (or verify) the host's runtime once the transaction commits."""
    if not needs_runtime(host):
        raise RuntimeRefused(f"{host.name} is a local host: it runs the local runtime of Volt's machine")
    if host.state not in KEPT_STATES:
        raise RuntimeRefused(
            f"{host.name} is {host.get_state_display().lower()}: its runtime is installed once it is available"
        )
    who = f" by {actor.get_username()}" if actor is not None and actor.is_authenticated else ""
    _save(host, (host.runtime or {}) | {"state": "queued", "step": f"queued{who}", "message": ""})
    enqueue_on_commit(TASK, host.pk)
    return host


def install_runtime(host_id: int) -> Host:
    """Install or verify Volt's runtime on the host, recording each step. Never raises for the host's
    own failures (they are recorded, with what to do); a busy host whose runtime is stale waits."""
    host = Host.objects.get(pk=host_id)
    if not needs_runtime(host) or host.state not in KEPT_STATES:
        return host
    if busy(host) and not is_ready(host) and (host.runtime or {}).get("key"):
        _save(host, host.runtime | {
            "state": "waiting",
            "step": "Volt's pins changed: the runtime is brought up to date when the host's cluster ends",
        })  # fmt: skip
        return host
    started = time.monotonic()
    record = {"state": "installing", "key": host_runtime.key(), "step": "connecting", "message": "",
              "started_at": timezone.now().isoformat(), "ready": False}  # fmt: skip
    _save(host, record)
    note_host(host, HostEventKind.RUNTIME, f"installing Volt's runtime ({host_runtime.key()})")
    last = [0.0]

    def progress(step: str) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            _save(host, host.runtime | {"step": step})

    try:
        with inventory.driver_for(host) as driver:
            found = host_runtime.install(driver, host.system or {}, progress)
    except DriverError as exc:
        message = str(exc)
        _save(host, record | {"state": "failed", "step": "", "message": message,
                              "took_s": round(time.monotonic() - started, 1)})  # fmt: skip
        note_host(host, HostEventKind.ERROR, f"runtime: {message}")
        return host
    took = round(time.monotonic() - started, 1)
    done = found.as_json() | {"state": "ready", "step": "", "message": "", "took_s": took,
                              "started_at": record["started_at"]}  # fmt: skip
    _save(host, done)
    if found.installed_now and found.method == "image":
        copied = f"{found.image_copied / 1e6:.0f} MB copied" if found.image_copied else "already on the host"
        how = f"installed by Volt from its image, {copied}"
    elif found.installed_now:
        how = f"installed by Volt, {found.wheels_copied} of {found.wheels} wheels copied"
    else:
        how = (
            "installed by Volt, verified"
            if found.installed_by == "volt"
            else "installed by the provider, verified"
        )
    note_host(host, HostEventKind.RUNTIME,
              f"runtime ready: {summary(done)} at {found.path} ({how}; {took:g} s)")  # fmt: skip
    inventory.capacity_changed()  # the host joins the offers
    return host


def refresh_runtimes(limit: int = 20) -> int:
    """Queue the install for SSH hosts whose runtime is not of Volt's current key, idle ones only (busy
    ones wait for their cluster's end). Hosts already queued or installing are left alone. Returns the
    number queued."""
    hosts = (
        Host.objects.filter(stale_q(), state__in=KEPT_STATES)
        .exclude(runtime__state__in=["queued", "installing"])
        .exclude(gpus__allocations__active=True)
        .exclude(runtime__state="failed", runtime__key=host_runtime.key())  # failed: a person retries
        .distinct()[:limit]
    )
    queued = 0
    for host in hosts:
        queue_install(host)
        queued += 1
    return queued


def check_nodes(hosts: list[Host]) -> dict[int, str]:
    """Check the runtime on each SSH host now (one command each): {host id: what is wrong, with what to
    do} for those that do not match. A host found stale is recorded so, and reinstalled when idle."""
    ssh_hosts = [host for host in hosts if needs_runtime(host)]
    if not ssh_hosts:
        return {}
    drivers = [inventory.driver_for(host) for host in ssh_hosts]
    try:
        found = fan_out(drivers, host_runtime.find)
    finally:
        for driver in drivers:
            driver.close()
    refused = {}
    for host, result in zip(ssh_hosts, found, strict=True):
        if isinstance(result, Exception):
            refused[host.pk] = f"{host.name}: its runtime could not be checked ({result})"
            continue
        if result.ready:
            if result.python != (host.runtime or {}).get("python"):  # e.g. a provider's, put in place since
                _save(host, (host.runtime or {}) | result.as_json() | {"state": "ready", "step": ""})
            continue
        refused[host.pk] = host_runtime.mismatch_message(host.name, result)
        _save(host, result.as_json() | {"state": "failed", "step": "",
                                        "message": refused[host.pk]})  # fmt: skip
        note_host(host, HostEventKind.ERROR, f"runtime: {refused[host.pk]}")
    return refused


def python_of(host: Host) -> str:
    """The Python an SSH host runs Ray, the probe and job drivers from: its recorded runtime's. Raises
    RuntimeProblem (with what to do) when the record is not a ready runtime of Volt's current key."""
    if not is_ready(host):
        raise host_runtime.RuntimeProblem(host_runtime.mismatch_message(host.name, host.runtime or {}))
    return host.runtime["python"]
