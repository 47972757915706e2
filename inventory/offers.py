"""Offer rows: how free capacity is shown, per precise GPU model x region x fabric kind.

`offers` aggregates hosts in SQL (`cached_offers`: a few seconds per viewer and query); the helpers shape
its rows and split hosts that carry two GPU models (rare) per model from their GPU rows. inventory.services
re-exports the functions (the app's face).
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Count, Max, Min, Q, QuerySet, Sum

from inventory.access import is_researcher, managed_provider_ids
from inventory.capacity import capacity_version
from inventory.choices import INTERCONNECT_FAMILIES, GpuHealth, HostState, ProviderStatus
from inventory.gpu_catalog import BY_MODEL, matching_models, memory_gib
from inventory.models import GPU, Host
from voltweb.services import is_platform_admin


def cents(value) -> Decimal | None:
    """A price rounded to cents (SQLite returns aggregated decimals unrounded: 0.390000000000000)."""
    return None if value is None else Decimal(value).quantize(Decimal("0.01"))


MIXED_MODELS = " + "  # Discovery.gpu_model joins the models of a host that has several


def offer_row(r: dict) -> dict:
    """One offer as the API and console show it, from an aggregated row (memory from the catalog if unknown)."""
    return {
        "gpu_model": r["gpu_model"],
        "memory_gib": memory_gib(
            r["memory_mib"] or getattr(BY_MODEL.get(r["gpu_model"]), "memory_mib", None)
        ),
        "region": r["site__region"],
        "fabric_kind": r["fabric__kind"],
        "free_gpus": r["free_sum"] or 0,
        "total_gpus": r["total_sum"] or 0,
        "hosts": r["host_count"],
        "hosts_with_free_gpus": r["hosts_with_free"],
        "max_free_gpus_per_host": r["max_free_per_host"] or 0,
        # SQLite returns aggregated decimals unrounded (0.390000000000000).
        "min_price_per_gpu_hour": cents(r["min_price"]),
        "max_price_per_gpu_hour": cents(r["max_price"]),
    }


def mixed_model_offers(hosts: QuerySet[Host]) -> list[dict]:
    """Offer rows of hosts with several GPU models: per (model, host) from the GPU table, then summed."""
    held = GPU.objects.filter(allocations__active=True).values("id")
    gpus = (
        GPU.objects.filter(
            host__in=hosts.filter(state=HostState.AVAILABLE, provider__status=ProviderStatus.APPROVED)
        )
        .exclude(health=GpuHealth.LOST)
        .values("model", "host_id", "host__site__region", "host__fabric__kind", "host__price_per_gpu_hour")
        .annotate(
            total=Count("id", distinct=True),
            free=Count("id", filter=Q(health=GpuHealth.HEALTHY) & ~Q(id__in=held), distinct=True),
            memory=Max("memory_mib"),
        )
    )
    per_host = [
        {
            "gpu_model": g["model"],
            "site__region": g["host__site__region"],
            "fabric__kind": g["host__fabric__kind"],
            "free_sum": g["free"],
            "total_sum": g["total"],
            "host_count": 1,
            "hosts_with_free": int(g["free"] > 0),
            "max_free_per_host": g["free"],
            "min_price": g["host__price_per_gpu_hour"],
            "max_price": g["host__price_per_gpu_hour"],
            "memory_mib": g["memory"],
        }
        for g in gpus
    ]
    return [offer_row(r) for r in per_host]


def merge_offers(rows: list[dict]) -> list[dict]:
    """Rows of the same (model, region, fabric kind) summed into one, cheapest first."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row["gpu_model"], row["region"], row["fabric_kind"])
        if key not in merged:
            merged[key] = dict(row)
            continue
        into = merged[key]
        for field in ("free_gpus", "total_gpus", "hosts", "hosts_with_free_gpus"):
            into[field] += row[field]
        into["max_free_gpus_per_host"] = max(into["max_free_gpus_per_host"], row["max_free_gpus_per_host"])
        into["min_price_per_gpu_hour"] = min(into["min_price_per_gpu_hour"], row["min_price_per_gpu_hour"])
        into["max_price_per_gpu_hour"] = max(into["max_price_per_gpu_hour"], row["max_price_per_gpu_hour"])
        into["memory_gib"] = into["memory_gib"] or row["memory_gib"]
    return sorted(
        merged.values(),
        key=lambda r: (r["min_price_per_gpu_hour"], r["gpu_model"], r["region"], r["fabric_kind"]),
    )


# --- the offers ----------------------------------------------------------------------------------


def interconnect_kinds(value: str) -> set[str]:
    """'infiniband' -> {ib_ndr, ib_hdr}; a single kind -> itself."""
    return set(INTERCONNECT_FAMILIES.get(value, {value}))


def offers(hosts: QuerySet[Host]) -> list[dict]:
    """Free capacity aggregated by precise GPU model x region x fabric kind, cheapest first.

    Each row shows the model's memory. A host with two GPU models ("A100-80GB + L40S") is counted
    once under each model, from its GPU rows.
    """
    rows = (
        hosts.filter(state=HostState.AVAILABLE, provider__status=ProviderStatus.APPROVED)
        .values("gpu_model", "site__region", "fabric__kind")
        .annotate(
            free_sum=Sum("free_gpus"),
            total_sum=Sum("gpu_count"),
            host_count=Count("id"),
            hosts_with_free=Count("id", filter=Q(free_gpus__gt=0)),
            max_free_per_host=Max("free_gpus"),
            min_price=Min("price_per_gpu_hour"),
            max_price=Max("price_per_gpu_hour"),
            memory_mib=Max("gpu_memory_mib"),
        )
        .order_by("min_price", "gpu_model", "site__region", "fabric__kind")
    )
    result = [offer_row(r) for r in rows if MIXED_MODELS not in r["gpu_model"]]
    mixed = [r["gpu_model"] for r in rows if MIXED_MODELS in r["gpu_model"]]
    if mixed:  # rare: split those hosts per model from their GPU rows, then merge
        result = merge_offers(result + mixed_model_offers(hosts.filter(gpu_model__in=mixed)))
    return result


def offered_models_matching(requested: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The precise models of existing hosts that each requested name matches (gpu_catalog.model_matches).

    "A100" -> ("A100-40GB", "A100-80GB") when both exist; a name nothing matches is kept as written.
    Placement calls this where a request's models meet the inventory. Cached per capacity version.
    """
    key = f"inventory:offered-models:{capacity_version()}"
    offered = cache.get(key)
    if offered is None:
        live = Host.objects.exclude(state__in=[HostState.RETIRED, HostState.FAILED]).exclude(gpu_model="")
        offered = sorted(set(live.values_list("gpu_model", flat=True).distinct()))
        cache.set(key, offered, 300)
    return matching_models(requested, offered)


OFFERS_CACHE_S = 5


def cached_offers(hosts: QuerySet[Host], user: AbstractBaseUser, query: str) -> list[dict]:
    """`offers(hosts)`, cached for a few seconds per caller view and query, dropped on any capacity change.

    Aggregating ~100k hosts costs ~100 ms; the console and CI poll offers far more often than capacity
    changes. The key holds the capacity version, so a change is visible at once, not after the TTL.
    """
    version = capacity_version()
    view = (
        "all" if is_platform_admin(user) else "researcher" if is_researcher(user) else "provider",
        tuple(sorted(managed_provider_ids(user))),
    )
    key = "inventory:offers:" + hashlib.sha256(repr((version, view, query)).encode()).hexdigest()
    rows = cache.get(key)
    if rows is None:
        rows = offers(hosts)
        cache.set(key, rows, OFFERS_CACHE_S)
    return rows
