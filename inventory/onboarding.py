"""Writing a discovery into the inventory: GPU rows (with per-GPU health), NIC ports, fabric warnings and
the injection bandwidth the ports give.

Called by inventory.services inside its transactions (onboarding and the health sweep); the rules:

- One bad GPU does not fail a host: a GPU with uncorrectable ECC errors, too hot, or lost is kept
  with its health and reason, and left out of free capacity (services.refresh_free_capacity counts
  healthy GPUs only), so offers and placement never see it.
- A machine retired and added again (how a host moves rack) brings its GPUs back: the retired
  host's GPU rows move to the new host, so allocation history (clusters.Allocation protects its GPU)
  stays attached to the same physical GPU. A GPU still owned by a live host refuses the onboarding.
"""

from __future__ import annotations

from django.db.models import F

from inventory.choices import FabricKind, GpuHealth, HostState
from inventory.discovery.network import Injection, fabric_warnings, injection
from inventory.discovery.probe import Discovery, lost_bus_id
from inventory.models import GPU, Host, NetworkPort

_REINDEX = 10_000  # moves a host's rows out of the way of (host, index) uniqueness while renumbering


class GpuOwnedElsewhere(Exception):
    """A discovered GPU belongs to a host that is not retired (the same machine added twice)."""


def _health(discovery: Discovery, index: int) -> tuple[str, str]:
    reason = discovery.gpu_problems.get(index, "")
    return (GpuHealth.UNHEALTHY, f"GPU {index} {reason}") if reason else (GpuHealth.HEALTHY, "")


def _check_owners(host: Host, discovery: Discovery) -> None:
    uuids = [gpu.uuid for gpu in discovery.gpus]
    owned = GPU.objects.filter(uuid__in=uuids).exclude(host=host).exclude(host__state=HostState.RETIRED)
    taken = list(owned.select_related("host")[:3])
    if taken:
        names = ", ".join(
            f"{g.uuid} (host {g.host.name}, {g.host.get_state_display().lower()})" for g in taken
        )
        raise GpuOwnedElsewhere(
            f"GPUs of this machine already belong to another host: {names}. The same machine was added "
            "twice: retire the other host first (retiring keeps its history), then retry onboarding."
        )


def _forget_stale(host: Host, discovery: Discovery) -> None:
    """Rows of GPUs no longer listed: lost ones (and any with allocation history) stay, as lost."""
    listed = {gpu.uuid for gpu in discovery.gpus}
    lost = {item.pci_bus_id: item.message for item in discovery.lost}
    taken = {gpu.index for gpu in discovery.gpus}
    spare = iter(range(max(taken | {-1}) + 1, _REINDEX))
    for row in GPU.objects.filter(host=host).exclude(uuid__in=listed):
        message = lost.get(lost_bus_id(row.pci_bus_id))
        if message is None and not row.allocations.exists():
            row.delete()
            continue
        row.health = GpuHealth.LOST
        row.health_reason = (message or "no longer listed by nvidia-smi")[:300]
        if row.index in taken:
            row.index = next(spare)
        row.save(update_fields=["health", "health_reason", "index"])


def store_gpus(host: Host, discovery: Discovery) -> set[int]:
    """Upsert the host's GPU rows from `discovery` (by UUID; a retired host's rows move here).

    Returns the ids of the retired hosts whose GPUs moved.
    """
    _check_owners(host, discovery)
    _forget_stale(host, discovery)
    listed = [gpu.uuid for gpu in discovery.gpus]
    moved_from = set(GPU.objects.filter(uuid__in=listed).exclude(host=host).values_list("host_id", flat=True))
    GPU.objects.filter(host=host, uuid__in=listed).update(index=F("index") + _REINDEX)
    for gpu in discovery.gpus:
        health, reason = _health(discovery, gpu.index)
        GPU.objects.update_or_create(
            uuid=gpu.uuid,
            defaults={
                "host": host,
                "index": gpu.index,
                "model": gpu.model,
                "name": gpu.name,
                "memory_mib": gpu.memory_total_mib,
                "nvlink_domain": discovery.domain_of(gpu.index),
                "pci_bus_id": gpu.pci_bus_id or "",
                "health": health,
                "health_reason": reason,
                "temperature_c": gpu.temperature_c,
                "utilization_pct": gpu.utilization_pct,
                "ecc_uncorrectable": gpu.ecc_uncorrectable,
            },
        )
    return moved_from


def store_ports(host: Host, discovery: Discovery) -> None:
    """Replace the host's NIC ports with the discovered ones (link layer, rate, state, closest GPUs)."""
    NetworkPort.objects.filter(host=host).delete()
    NetworkPort.objects.bulk_create(
        NetworkPort(
            host=host,
            ca=port.ca,
            port=port.port,
            link_layer=port.link_layer,
            transport=port.transport,
            rate_gbps=port.rate_gbps,
            state=port.state,
            physical_state=port.physical_state,
            closest_gpus=discovery.nic_of(port.ca).get("closest_gpus", []),
            gpu_link=discovery.nic_of(port.ca).get("gpu_link", ""),
            source=port.source,
        )
        for port in discovery.ib_ports
    )


def network_warnings(host: Host, discovery: Discovery) -> list[str]:
    """Where the discovered ports contradict the host's declared fabric (shown on the host page/API), the
    ports together giving less than the fabric's per-host bandwidth included."""
    label = FabricKind(host.fabric.kind).label
    return fabric_warnings(
        host.fabric.kind,
        f"{label} ({host.fabric.name})",
        discovery.ib_ports,
        declared_gbytes_per_s=host.fabric.per_host_gbytes_per_s,
    )


def discovered_injection(host: Host, discovery: Discovery) -> Injection:
    """What the host's ports can put on its fabric (GB/s; None when no port is up): placement predicts
    from the smaller of this and the fabric's declared per-host figure."""
    return injection(host.fabric.kind, discovery.ib_ports)


def apply_health(host: Host, discovery: Discovery) -> list[str]:
    """A health check's per-GPU verdicts written to the rows; returns what changed, in words."""
    changes: list[str] = []
    rows = {row.index: row for row in GPU.objects.filter(host=host)}
    lost = {item.pci_bus_id: item.message for item in discovery.lost}
    for gpu in discovery.gpus:
        row = rows.get(gpu.index)
        if row is None or row.uuid != gpu.uuid:
            continue  # a different card: the next onboarding (rediscover) records it
        health, reason = _health(discovery, gpu.index)
        if row.health != health:
            changes.append(reason or f"GPU {gpu.index} healthy again")
        GPU.objects.filter(pk=row.pk).update(
            health=health,
            health_reason=reason,
            temperature_c=gpu.temperature_c,
            utilization_pct=gpu.utilization_pct,
            ecc_uncorrectable=gpu.ecc_uncorrectable,
        )
    for row in rows.values():
        message = lost.get(lost_bus_id(row.pci_bus_id)) if row.pci_bus_id else None
        if message and row.health != GpuHealth.LOST:
            changes.append(f"GPU {row.index} lost: {message}")
            GPU.objects.filter(pk=row.pk).update(health=GpuHealth.LOST, health_reason=message[:300])
    return changes


def healthy_domain_size(host: Host) -> int:
    """The largest NVLink domain counting healthy GPUs only (what one node could ever get)."""
    sizes: dict[int, int] = {}
    for domain in GPU.objects.filter(host=host, health=GpuHealth.HEALTHY).values_list(
        "nvlink_domain", flat=True
    ):
        sizes[domain] = sizes.get(domain, 0) + 1
    return max(sizes.values(), default=0)


def private_address_problem(host: Host, addresses: tuple[str, ...]) -> str:
    """Why the host's declared private address cannot be its node address ("" when it can, or none is set).

    Ray, the probe and collectives bind that address on the host: one the host does not have would fail
    every cluster at "waiting for workers" instead of here."""
    if not host.private_address or host.private_address in addresses:
        return ""
    have = ", ".join(a for a in addresses if not a.startswith("127.")) or "none besides loopback"
    return (
        f"{host.name} has no address {host.private_address} (its IPv4 addresses: {have}); retire this host "
        "and add it again with the private address its provider's other hosts reach it at, or with none "
        "when that is the address Volt connects to."
    )
