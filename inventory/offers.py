"""Offer rows: how free capacity is shown, per precise GPU model x region x fabric kind.

`inventory.services.offers` aggregates hosts in SQL; the helpers here shape its rows and split hosts that
carry two GPU models (rare) per model from their GPU rows.
"""

from __future__ import annotations

from decimal import Decimal

from django.db.models import Count, Max, Q, QuerySet

from inventory.choices import GpuHealth, HostState, ProviderStatus
from inventory.gpu_catalog import BY_MODEL, memory_gib
from inventory.models import GPU, Host


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
