"""Baselines for the benchmarks: first fit (a GPU marketplace) and plain best fit by free-GPU count
(a quota scheduler). Both are blind to topology.

They keep the hard filters a marketplace offers (model, free GPUs, price, region, a required
interconnect) and the engine's allocation rules for one node (nodes.node_gpus: one NVLink domain,
or any free GPUs of a PCIe-only host). Their plans are scored with the same bandwidth model as the
engine's, so the policies can be compared on one inventory.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from .bandwidth import Measured, allreduce_seconds, cluster_busbw_gbps, lowest_common_level
from .nodes import node_gpus
from .types import Constraint, HostSnapshot, NodeAssignment, PlacementRequest, Plan, Refusal


def _fits(request: PlacementRequest, host: HostSnapshot, model: str) -> tuple[int, ...] | None:
    """The GPU indices a baseline takes on `host` (the engine's rule for one node), or None."""
    cap = request.max_price_per_gpu_hour
    if host.gpu_model != model or (cap is not None and host.price_per_gpu_hour > cap):
        return None
    if request.regions and host.path.region not in request.regions:
        return None
    required = request.interconnect_mode == Constraint.REQUIRED
    if required and host.fabric_kind not in request.interconnect_kinds():
        return None
    chosen = node_gpus(host, request.gpus_per_node)
    return None if chosen is None else chosen[1]


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
                    return _plan(
                        request, model, chosen, measured, "first-fit: the first hosts in input order that fit"
                    )
    return Refusal(("first-fit: not enough hosts",))


def _plan(request: PlacementRequest, model: str, chosen: list, measured: Measured | None, why: str) -> Plan:
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
        explanation=(why,),
    )


def best_fit(
    request: PlacementRequest, hosts: Iterable[HostSnapshot], measured: Measured | None = None
) -> Plan | Refusal:
    """Plain best fit by free-GPU count, blind to topology (a quota scheduler): the hosts with the fewest
    free GPUs that can still take a node, input order breaking ties, for the first model that has enough."""
    listed = list(hosts)
    for model in request.models:
        fitting = [(host, indices) for host in listed if (indices := _fits(request, host, model)) is not None]
        if len(fitting) >= request.nodes:
            # nsmallest is stable: input order breaks ties
            tightest = heapq.nsmallest(request.nodes, fitting, key=lambda pair: pair[0].free_count())
            return _plan(request, model, tightest, measured, "best-fit by free GPUs")
    return Refusal(("best-fit: not enough hosts",))
