"""Inventory operations: provider registration, host onboarding and lifecycle, what each user may see.

Views, API viewsets and tasks call these functions; nothing else writes inventory models.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F, QuerySet
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from inventory import onboarding, transitions, validation
from inventory.access import (  # noqa: F401 - the app's face: who may see and change what
    PUBLIC_EVENT_FIELDS,
    can_manage_provider,
    host_event_for,
    is_researcher,
    managed_blocks,
    managed_hosts,
    managed_provider_ids,
    managed_providers,
    offerable_hosts,
    runtime_ready_q,
    visible_gpus,
    visible_hosts,
    visible_providers,
)
from inventory.capacity import bump_capacity_version, capacity_version  # noqa: F401 - the app's face
from inventory.choices import (
    DriverKind,
    FabricKind,
    GpuHealth,
    HostEventKind,
    HostState,
    OnboardingError,
)
from inventory.discovery.network import port_counts
from inventory.discovery.probe import Discovery, DiscoveryFailed, discover
from inventory.drill_records import (  # noqa: F401 - the app's face for other apps: drills' rows
    drill_behind,
    drill_holds,
    drill_keeping_out,
    forget_drill,
    held_drill_fault,
    hosts_kept_out_by,
    open_drill_cluster_pks,
)
from inventory.drivers.base import HostDriver
from inventory.drivers.local import LocalDriver, ThisMachine, create_sandbox
from inventory.gpu_catalog import (
    BY_MODEL,
    model_matches,  # noqa: F401 - the app's face: one matching rule (quotas)
)
from inventory.local_fabric import (  # noqa: F401 - re-exported: the emulated fabric of local hosts
    active_faults,
    bandwidth_scale,
    clear_host_fault,
    fault_value,
    inject_fault,
    link_faults,
    links_emulated,
    sandbox_path,
    unavailable_reason,
)
from inventory.local_fabric import preload as _local_preload
from inventory.local_fabric import remove_all as remove_local_fabric  # noqa: F401 - re-exported
from inventory.local_fabric import sync as sync_local_fabric  # noqa: F401 - re-exported
from inventory.local_fabric import sync_after_commit as _sync_fabric_after_commit
from inventory.models import (
    GPU,
    Block,
    Host,
    HostDrill,
    HostEvent,
    Provider,
)
from inventory.offers import (  # noqa: F401 - the app's face: the offers
    OFFERS_CACHE_S,
    cached_offers,
    interconnect_kinds,
    offered_models_matching,
    offers,
)
from inventory.providers import (  # noqa: F401 - the app's face: providers and their fabrics
    add_provider_admin,
    create_fabric,
    get_or_create_site,
    register_provider,
    review_provider,
)
from voltweb import crypto
from voltweb.celery import app
from voltweb.services import is_team_admin
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)


# --- hosts: adding and onboarding --------------------------------------------------------------------


@dataclass(frozen=True)
class HostRequest:
    """What a provider admin submits to add a host (console form or API)."""

    name: str
    block: Block
    driver: str
    price_per_gpu_hour: Decimal
    address: str = ""
    ssh_port: int = 22
    ssh_user: str = ""
    ssh_private_key: str = field(default="", repr=False)  # never in a log line or an error report
    ssh_host_key: str = ""
    private_address: str | None = None
    overlay_endpoint: str = ""
    local_spec: dict | None = None
    local_faults: dict | None = None


def driver_for(host: Host) -> HostDriver:
    """The driver that reaches `host`, configured from its record."""
    timeout = settings.VOLT_DRIVER_TIMEOUT_S
    if host.driver == DriverKind.LOCAL:
        return LocalDriver(
            sandbox_path(host), host.address, default_timeout=timeout, preload=_local_preload()
        )
    from inventory.drivers.ssh import SshDriver

    return SshDriver(
        host=host.address,
        port=host.ssh_port,
        username=host.ssh_user or "root",
        private_key=crypto.decrypt(host.ssh_private_key_encrypted) or None,
        known_host_key=host.ssh_host_key or None,
        connect_timeout=min(settings.VOLT_SSH_CONNECT_TIMEOUT_S, timeout),
        command_timeout=timeout,
    )


def local_machine_driver() -> HostDriver:
    """The machine local hosts live on, whatever state any of them is in (a cluster's Unix user is this
    machine's, not one host's: it is removed here even when a host is faulted `unreachable`)."""
    return ThisMachine(default_timeout=settings.VOLT_DRIVER_TIMEOUT_S)


@sensitive_variables("request")
def add_host(
    provider: Provider, request: HostRequest, actor: AbstractBaseUser | None = None, queue: bool = True
) -> Host:
    """Create the host in ONBOARDING and queue discovery (`queue=False`: the caller runs onboard_host).

    Raises validation.HostRefused when the provider is not approved or the caller may not use the
    driver (`actor=None`: Volt itself, e.g. seed_demo); validation errors name the field to fix.
    """
    validation.check_may_add_host(provider, request.driver, actor)
    _validate_host_request(provider, request)
    try:
        with transaction.atomic():
            host = Host.objects.create(
                provider=provider,
                name=request.name,
                site=request.block.fabric.site,
                fabric=request.block.fabric,
                block=request.block,
                driver=request.driver,
                address=_address_for(request),
                ssh_port=request.ssh_port,
                ssh_user=request.ssh_user,
                ssh_private_key_encrypted=crypto.encrypt(request.ssh_private_key),
                ssh_host_key=request.ssh_host_key.strip(),
                private_address=(request.private_address or None)
                if request.driver == DriverKind.SSH
                else None,
                overlay_endpoint=request.overlay_endpoint if request.driver == DriverKind.SSH else "",
                local_spec=_local_spec(request),
                price_per_gpu_hour=request.price_per_gpu_hour,
                onboarding_started_at=timezone.now(),
            )
            HostEvent.objects.create(
                host=host,
                kind=HostEventKind.STATE,
                to_state=HostState.ONBOARDING,
                message="host added; discovery queued",
                actor=actor if actor and actor.is_authenticated else None,
            )
            if host.driver == DriverKind.LOCAL:
                create_sandbox(sandbox_path(host), host.local_spec, request.local_faults)
            if queue:
                _queue_onboarding(host)
    except IntegrityError:
        raise ValidationError(
            {"name": "One of your hosts already has this name or address; pick another."}
        ) from None
    return host


def _validate_host_request(provider: Provider, request: HostRequest) -> None:
    errors: dict[str, str] = {}
    if request.block.fabric.provider_id != provider.pk:
        errors["block"] = "This block's fabric belongs to another provider; pick one of your own fabrics."
    if Host.objects.filter(provider=provider, name=request.name).exists():
        errors["name"] = f"You already have a host named {request.name!r}."
    elif request.driver == DriverKind.SSH and _own_host_at(provider, request):
        errors["address"] = f"You already have a host at {request.address.strip()}:{request.ssh_port}."
    nics = (request.local_spec or {}).get("nics") if request.driver == DriverKind.LOCAL else None
    for name, messages in validation.host_request_errors(
        request.address, request.ssh_user, request.ssh_private_key, request.ssh_host_key, nics
    ).items():
        errors[name] = " ".join(messages)
    if request.driver == DriverKind.SSH:
        if not request.address:
            errors["address"] = "SSH hosts need an address (IP or DNS name)."
        if not request.ssh_private_key and not request.ssh_user:
            errors["ssh_user"] = "Give the SSH user Volt logs in as."
    elif request.driver == DriverKind.LOCAL:
        if request.address and not _is_local_host_address(request.address):
            errors["address"] = (
                "A local host's address is a loopback address 127.0.x.y with y >= 2 (or empty)."
            )
        spec = request.local_spec or {}
        if spec.get("gpu_model") not in BY_MODEL:
            errors["gpu_model"] = f"Unknown GPU model; choose one of {', '.join(BY_MODEL)}."
        count = spec.get("gpu_count")
        if not isinstance(count, int) or not 1 <= count <= 16:
            errors["gpu_count"] = "A local host has 1 to 16 GPUs."
    else:
        errors["driver"] = f"Unknown driver {request.driver!r}; use local or ssh."
    if errors:
        raise ValidationError(errors)


def _is_local_host_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip in ipaddress.ip_network("127.0.0.0/16") and ip.packed[3] >= 2


def _local_spec(request: HostRequest) -> dict:
    if request.driver != DriverKind.LOCAL:
        return {}
    spec = dict(request.local_spec or {})
    spec.setdefault("seed", f"{request.name}-{timezone.now().timestamp()}")
    return spec


def _own_host_at(provider: Provider, request: HostRequest) -> bool:
    """Whether `provider` (only it: other providers' hosts are none of its business) has a live host there."""
    same = Host.objects.filter(
        provider=provider, driver=request.driver, address=request.address.strip(), ssh_port=request.ssh_port
    )
    return same.exclude(state=HostState.RETIRED).exists()


def _address_for(request: HostRequest) -> str:
    if request.driver != DriverKind.LOCAL:
        return request.address.strip()
    return request.address or next_local_address()


def next_local_address() -> str:
    """The first free 127.0.x.y (y >= 2): each local host gets its own loopback address (DESIGN.md)."""
    used = set(
        Host.objects.filter(driver=DriverKind.LOCAL)
        .exclude(state=HostState.RETIRED)
        .values_list("address", flat=True)
    )
    for candidate in ipaddress.ip_network("127.0.0.0/16").hosts():
        text = str(candidate)
        if candidate.packed[3] >= 2 and text not in used:
            return text
    raise ValidationError({"address": "No free loopback address left for local hosts."})


def _queue_onboarding(host: Host) -> None:
    enqueue_on_commit("inventory.tasks.onboard_host_task", host.pk)


def onboard_host(host_id: int) -> Host:
    """Discover the host's GPUs and interconnect, check health, and make it available — or record why not.

    Idempotent: a redelivered task finds the host past ONBOARDING and returns it unchanged.
    """
    host = Host.objects.select_related("provider").get(pk=host_id)
    if host.state != HostState.ONBOARDING:
        return host
    _event(host, HostEventKind.DISCOVERY, f"connecting to {host.address} through the {host.driver} driver")
    try:
        with driver_for(host) as driver:
            discovery = discover(driver, settings.VOLT_DRIVER_TIMEOUT_S, settings.VOLT_GPU_MAX_TEMP_C)
            seen_key = getattr(driver, "seen_host_key", None)
    except DiscoveryFailed as failure:
        return _fail_onboarding(host, failure.code, failure.message)
    except ValueError as exc:
        return _fail_onboarding(host, "driver_error", str(exc))
    if problem := onboarding.private_address_problem(host, discovery.system.addresses):
        return _fail_onboarding(host, OnboardingError.DRIVER_ERROR, problem)
    try:
        return _record_discovery(host, discovery, seen_key)
    except onboarding.GpuOwnedElsewhere as exc:
        return _fail_onboarding(host, OnboardingError.GPU_OWNED_ELSEWHERE, str(exc))
    except Exception as exc:  # noqa: BLE001 - a host must never sit in ONBOARDING with no error
        logger.exception("recording the discovery of host %s failed", host.pk)
        return _fail_onboarding(
            host,
            OnboardingError.INTERNAL,
            f"Discovery succeeded but Volt could not record it ({exc.__class__.__name__}: {exc}); "
            "retry onboarding, and report it to the platform admins if it fails again.",
        )


RECORD_ATTEMPTS = 3


def _record_discovery(host: Host, discovery: Discovery, seen_key: str | None) -> Host:
    """Record a discovery; a database still locked after its busy timeout (SQLite, the demo) is tried again.

    The recording is one transaction, rolled back whole when it fails, so trying again is safe; the
    discovery itself (minutes on a slow host) is not repeated.
    """
    for attempt in range(1, RECORD_ATTEMPTS + 1):
        try:
            return _complete_onboarding(host, discovery, seen_key)
        except OperationalError as exc:
            if attempt == RECORD_ATTEMPTS or "locked" not in str(exc):
                raise
            logger.warning("recording the discovery of host %s: %s; trying again (%d)", host.pk, exc, attempt)
            time.sleep(attempt)
            host.refresh_from_db()
    raise AssertionError("unreachable")


def _fail_onboarding(host: Host, code: str, message: str) -> Host:
    with transaction.atomic():
        _event(host, HostEventKind.ERROR, message)
        return transitions.transition_host(
            host,
            HostState.FAILED,
            reason=f"onboarding failed: {OnboardingError(code).label if code in OnboardingError.values else code}",
            extra={"error_code": code, "error_message": message, "free_gpus": 0, "free_gpu_map": []},
        )


@transaction.atomic
def _complete_onboarding(host: Host, discovery: Discovery, seen_key: str | None) -> Host:
    moved_from = onboarding.store_gpus(host, discovery)
    onboarding.store_ports(host, discovery)
    warnings = onboarding.network_warnings(host, discovery)
    found = onboarding.discovered_injection(host, discovery)
    summary = _discovery_summary(discovery)
    system = discovery.system
    overlay = system.overlay_summary if host.driver == DriverKind.SSH else ""  # local hosts share loopback
    _event(host, HostEventKind.DISCOVERY, f"system: {', '.join(filter(None, (system.summary, overlay)))}")
    _event(host, HostEventKind.DISCOVERY, summary)  # the GPUs' line last: the newest discovery line
    for problem in _gpu_problem_lines(discovery):
        _event(host, HostEventKind.HEALTH, problem)
    for warning in warnings:
        _event(host, HostEventKind.ERROR, f"network: {warning}")
    extra = {
        "gpu_model": discovery.gpu_model,
        "gpu_count": len(discovery.gpus),
        "gpu_memory_mib": max((g.memory_total_mib or 0 for g in discovery.gpus), default=0) or None,
        "nvlink_domain_size": onboarding.healthy_domain_size(host),
        "discovery": discovery.as_json() | {"network_warnings": warnings, "injection_ports": found.ports},
        "discovered_gbytes_per_s": found.gbytes_per_s,
        "pcie_topology": discovery.pcie_topology(),
        "system": discovery.system.as_json(),
        "error_code": "",
        "error_message": "",
        "last_heartbeat_at": timezone.now(),
    }
    if seen_key and not host.ssh_host_key:
        extra["ssh_host_key"] = seen_key  # trust on first use, pinned from now on
    transitions.transition_host(host, HostState.AVAILABLE, reason=summary, extra=extra)
    if host.driver == DriverKind.SSH:  # the host joins the offers once its runtime is ready
        enqueue_on_commit("inventory.tasks.install_runtime_task", host.pk)
        enqueue_on_commit("inventory.tasks.check_reachability_task", host.pk)
    refresh_free_capacity([host.pk, *moved_from])
    capacity_changed()
    if host.driver == DriverKind.LOCAL:
        _sync_fabric_after_commit()
    host.refresh_from_db()
    return host


def _discovery_summary(discovery: Discovery) -> str:
    counts = port_counts(discovery.ib_ports)
    healthy = len(discovery.healthy_indices)
    return (
        f"found {len(discovery.gpus)} x {discovery.gpu_model} ({healthy} healthy), NVLink domains "
        f"{[list(d) for d in discovery.nvlink_domains]}, ports up: {counts['infiniband']} InfiniBand, "
        f"{counts['roce']} RoCE, {counts['ethernet']} Ethernet"
    )


def _gpu_problem_lines(discovery: Discovery) -> list[str]:
    lines = [f"GPU {index} unhealthy: {reason}" for index, reason in sorted(discovery.gpu_problems.items())]
    return lines + [f"GPU lost: {lost.message}" for lost in discovery.lost]


def capacity_changed() -> None:
    """Tell the placement queue that capacity appeared (after commit).

    By task name: the clusters app depends on the inventory, not the other way round.
    """

    def send() -> None:
        try:
            app.send_task("clusters.tasks.drain_queue_task", queue="placement")
        except Exception:  # noqa: BLE001 - the periodic drain catches up if the broker is down
            logger.warning("could not notify the placement queue", exc_info=True)

    transaction.on_commit(send)


def _event(host: Host, kind: str, message: str) -> None:
    transitions.note_host(host, kind, message)


# --- hosts: lifecycle actions by provider admins -----------------------------------------------------

HOST_ACTIONS = {  # in the order the console shows the buttons; the destructive one last
    "rediscover": HostState.ONBOARDING,
    "uncordon": HostState.AVAILABLE,
    "drain": HostState.DRAINING,
    "cordon": HostState.CORDONED,
    "retire": HostState.RETIRED,
}
# States a person's action never starts from, though the state machine has the move: an onboarding host
# becomes available when its discovery passes, never by an uncordon (the console offered one).
HOST_ACTION_NOT_FROM = {"uncordon": {HostState.ONBOARDING}}


def host_action_possible(host: Host, action: str) -> bool:
    """Whether `action` may be taken on the host in its current state (the console's buttons)."""
    if host.state in HOST_ACTION_NOT_FROM.get(action, ()):
        return False
    return HOST_ACTIONS[action] in transitions.HOST_TRANSITIONS.get(host.state, {})


def act_on_host(
    host: Host,
    action: str,
    actor: AbstractBaseUser | None = None,
    reason: str = "",
    drill: HostDrill | None = None,
) -> Host:
    """Drain, cordon, uncordon, retire or re-discover a host (raises IllegalTransition from a wrong state).

    Re-discovery onboards again, so it follows `add_host`'s rules (validation.HostRefused). `drill`: the
    fault drill that made the host fail (a drill cordon, lifted when the drill's cluster ends).
    """
    target = HOST_ACTIONS[action]
    if host.state in HOST_ACTION_NOT_FROM.get(action, ()):
        raise transitions.statemachine.IllegalTransition(host, host.state, target)
    extra: dict = {}
    if target == HostState.ONBOARDING:
        validation.check_may_add_host(host.provider, host.driver, actor)
        extra = {"onboarding_started_at": timezone.now(), "error_code": "", "error_message": ""}
    with transaction.atomic():
        host = transitions.transition_host(
            host, target, reason=reason or f"{action} requested", actor=actor, extra=extra, drill=drill
        )
        if target == HostState.ONBOARDING:
            _queue_onboarding(host)
        if target == HostState.AVAILABLE:
            capacity_changed()
        if target == HostState.RETIRED and host.driver == DriverKind.LOCAL:
            _sync_fabric_after_commit()
    return host


def may_act_on_host(user: AbstractBaseUser, host: Host, action: str) -> bool:
    """Provider admins (and platform admins) act on their hosts. A cordon recovery put on a host after a
    fault drill may also be lifted by the team admin who ran the drill, while it is that drill's."""
    if can_manage_provider(user, host.provider):
        return True
    if action != "uncordon" or host.state != HostState.CORDONED or not user.is_authenticated:
        return False
    drill = drill_keeping_out(host)
    return (
        drill is not None
        and drill.actor_id == user.pk
        and drill.team is not None
        and is_team_admin(user, drill.team)
    )


def cordoned_hosts_line(limit: int = 10) -> str:
    """ "Cordoned hosts: h100-a (after a fault drill by tom on cluster 12), ..." or "" when none: what
    the demo's start line says, so hosts a restart leaves out of service are not a surprise."""
    hosts = list(Host.objects.filter(state=HostState.CORDONED).order_by("name", "pk")[: limit + 1])
    if not hosts:
        return ""
    parts = []
    for host in hosts[:limit]:
        drill = drill_keeping_out(host)
        if drill is not None:
            why = f"after a fault drill by {drill.actor_name} on cluster {drill.cluster_pk}"
        else:
            event = host.events.filter(kind=HostEventKind.STATE, to_state=HostState.CORDONED).first()
            why = (event.message if event else "") or "cordoned"
            why = why if len(why) <= 60 else why[:59] + "…"
        parts.append(f"{host.name} ({why})")
    more = Host.objects.filter(state=HostState.CORDONED).count() - limit if len(hosts) > limit else 0
    return "Cordoned hosts: " + ", ".join(parts) + (f", and {more} more" if more else "")


def port_shortfalls(hosts: QuerySet[Host]) -> QuerySet[Host]:
    """Those of `hosts` whose ports give less than their fabric declares per host (issue 23): placement
    predicts from the ports' figure. One query, whatever the number of hosts."""
    live = hosts.exclude(state=HostState.RETIRED)
    return live.filter(discovered_gbytes_per_s__lt=F("fabric__per_host_gbytes_per_s")).select_related(
        "fabric"
    )


def host_history(host: Host) -> QuerySet[HostEvent]:
    return host.events.select_related("actor")


def reap_stuck_onboarding(older_than_s: int | None = None) -> int:
    """Fail hosts stuck in ONBOARDING past the deadline (their task was lost); returns how many."""
    limit = older_than_s or settings.CELERY_TASK_TIME_LIMIT * 2
    deadline = timezone.now() - timezone.timedelta(seconds=limit)
    reaped = 0
    for host in Host.objects.filter(state=HostState.ONBOARDING, onboarding_started_at__lt=deadline):
        try:
            _fail_onboarding(
                host, "timeout", f"Onboarding did not finish within {limit} s; retry onboarding."
            )
            reaped += 1
        except transitions.statemachine.IllegalTransition:
            continue
    return reaped


# A local host's NICs by fabric kind: (count, the fields of each), so that its ports give the kind's
# default per-host figure (choices.DEFAULT_HOST_BANDWIDTH_GBYTES: 8 x 400 Gb/s = 400 GB/s on NDR, one
# 100 GbE port = 12.5 GB/s) and onboarding confirms what the fabric declares. An Ethernet NIC is RoCE unless
# "roce" is false (inventory.drivers.simulator).
LOCAL_NICS = {
    FabricKind.IB_NDR: (8, {"link_layer": "InfiniBand", "rate_gbps": 400}),
    FabricKind.IB_HDR: (8, {"link_layer": "InfiniBand", "rate_gbps": 200}),
    FabricKind.ROCE: (8, {"link_layer": "Ethernet", "rate_gbps": 200}),
    FabricKind.ETH_100G: (1, {"link_layer": "Ethernet", "rate_gbps": 100, "roce": False}),
    FabricKind.ETH_25G: (1, {"link_layer": "Ethernet", "rate_gbps": 25, "roce": False}),
    FabricKind.ETH_10G: (1, {"link_layer": "Ethernet", "rate_gbps": 10, "roce": False}),
}


def default_local_spec(gpu_model: str, gpu_count: int, fabric_kind: str, nvlink: bool | None = None) -> dict:
    """A local host's declared hardware, with NICs whose ports give its fabric kind's default per-host
    bandwidth (LOCAL_NICS: eight for the RDMA fabrics whatever the GPU count, one port for Ethernet)."""
    count, fields = LOCAL_NICS.get(fabric_kind, (0, {}))
    nics = [{"name": f"mlx5_{i}", **fields} for i in range(count)]
    spec = {"gpu_model": gpu_model, "gpu_count": gpu_count, "nics": nics}
    if nvlink is not None:
        spec["nvlink"] = nvlink
    return spec


def refresh_free_capacity(host_ids: list[int]) -> None:
    """Recompute free_gpus and free_gpu_map from healthy GPUs that no active allocation holds.

    Called inside the transaction that changed GPUs or allocations (the clusters app allocates);
    the allocation table stays the truth, these columns are what offers and placement read fast.
    """
    free: dict[int, dict[int, list[int]]] = {host_id: {} for host_id in host_ids}
    rows = (
        GPU.objects.filter(host_id__in=host_ids, health=GpuHealth.HEALTHY)
        .exclude(allocations__active=True)
        .order_by("host_id", "nvlink_domain", "index")
        .values_list("host_id", "nvlink_domain", "index")
    )
    for host_id, domain, index in rows:
        free[host_id].setdefault(domain, []).append(index)
    for host_id, domains in free.items():
        free_map = [domains[d] for d in sorted(domains)]
        Host.objects.filter(pk=host_id).update(free_gpu_map=free_map, free_gpus=sum(len(d) for d in free_map))
    bump_capacity_version()
