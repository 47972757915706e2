"""First-fit placement, the GPU-marketplace approach, used only as the benchmark's baseline.

It keeps the hard filters a marketplace offers (model, free GPUs, price, region, a required
interconnect) and takes the first hosts in input order, blind to topology. Its plan is scored with
the same bandwidth model as the engine's, so the two can be compared on one inventory.
"""

from __future__ import annotations

from collections.abc import Iterable

from .bandwidth import Measured, allreduce_seconds, cluster_busbw_gbps, lowest_common_level
from .types import Constraint, HostSnapshot, NodeAssignment, PlacementRequest, Plan, Refusal


def _fits(request: PlacementRequest, host: HostSnapshot, model: str) -> tuple[int, ...] | None:
    """The GPU indices first-fit takes on `host` (first NVLink domain with room), or None."""
    cap = request.max_price_per_gpu_hour
    if host.gpu_model != model or (cap is not None and host.price_per_gpu_hour > cap):
        return None
    if request.regions and host.path.region not in request.regions:
        return None
    required = request.interconnect_mode == Constraint.REQUIRED
    if required and host.fabric_kind not in request.interconnect_kinds():
        return None
    for free in host.free_gpus:
        if len(free) >= request.gpus_per_node:
            return tuple(sorted(free)[: request.gpus_per_node])
    return None


def first_fit(
    request: PlacementRequest, hosts: Iterable[HostSnapshot], measured: Measured | None = None
) -> Plan | Refusal:
    """The first `nodes` hosts in input order that fit, for the first listed model that has enough."""
    listed = list(hosts)
    for model in request.models:
        chosen: list[tuple[HostSnapshot, tuple[int, ...]]] = []
        for host in listed:
            indices = _fits(request, host, model)
            if indices is not None:
                chosen.append((host, indices))
                if len(chosen) == request.nodes:
                    return _plan(request, model, chosen, measured)
    return Refusal(("first-fit: not enough hosts",))


def _plan(request: PlacementRequest, model: str, chosen: list, measured: Measured | None) -> Plan:
    hosts = [host for host, _ in chosen]
    busbw = cluster_busbw_gbps(hosts, measured)
    level = lowest_common_level(hosts)
    seconds = None
    if busbw is not None and level is not None:
        seconds = allreduce_seconds(request.reference_gradient_bytes, len(hosts), busbw, level)
    return Plan(
        model=model,
        nodes=tuple(NodeAssignment(host.host_id, indices) for host, indices in chosen),
        head_host_id=hosts[0].host_id,
        spanned_level=str(level) if level is not None else "host",
        spanned_domain=hosts[0].path.domain(level) if level is not None else (hosts[0].host_id,),
        predicted_busbw_gbps=busbw,
        predicted_allreduce_s=seconds,
        price_per_hour=round(sum(h.price_per_gpu_hour for h in hosts) * request.gpus_per_node, 6),
        explanation=("first-fit: the first hosts in input order that fit",),
    )
