"""Placement engine benchmark: plan latency and plan quality on generated inventories.

    .venv/bin/python bench/placement.py [--sizes 1000,10000,125000] [--repeats 60] [--seed 7]
        [--endpoint-hosts 125000] [--endpoint-requests 30] [--database-url postgres://.../volt_bench]

Inventories: regions -> sites -> fabrics (IB NDR/HDR, RoCE, Ethernet) -> blocks of 16-32 hosts,
8 GPUs per host (1,000,000 GPUs at 125,000 hosts), five GPU models, 30-60% of GPUs busy (each
block has its own load: some hosts fully taken by multi-node jobs, some partly, the rest free).
For each size it times the index build, then plans 1x8, 4x8 and 32x8 FSDP requests (InfiniBand
preferred; the model rotates over H100, H200, A100) and reports p50/p95 latency. Quality: the
predicted busbw of Volt's plan divided by first-fit's (the marketplace approach: the first hosts in
listing order that fit), both scored by the same bandwidth model. The index goes into gc.freeze()
once built (a long-lived index should not be walked by every full collection; a worker holding one
should do the same).

Then, end to end: it seeds PostgreSQL with --endpoint-hosts hosts (bench/inventory.py's COPY seeder, a
database of its own, dropped afterwards) and times `POST /api/v1/placements/preview` through Django's
test Client with a researcher's bearer token — SQL candidate query, snapshots, index build, plan and
JSON — for the same three shapes. --endpoint-hosts 0 skips it. The last line is JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusters.placement import (  # noqa: E402
    DECLARED_HOST_GBPS,
    HostSnapshot,
    Inventory,
    PlacementRequest,
    Plan,
    TopologyPath,
    first_fit,
    plan,
)

REGIONS = ("us-east", "us-west", "eu-west", "eu-north", "ap-south", "ap-east")
# model: (share of fabrics, price range $/GPU-hour, NVLink domain size)
MODELS = {
    "H100": (0.35, (2.2, 3.2), 8),
    "H200": (0.15, (3.0, 4.2), 8),
    "A100": (0.25, (1.1, 1.9), 8),
    "L40S": (0.15, (0.7, 1.1), 4),
    "RTX 4090": (0.10, (0.3, 0.6), 4),
}
# fabric kind: (share, oversubscription choices)
FABRICS = {
    "ib_ndr": (0.35, (1.0, 2.0)),
    "ib_hdr": (0.20, (1.0, 2.0)),
    "roce": (0.25, (1.0, 2.0, 3.0)),
    "eth_100g": (0.15, (1.0,)),
    "eth_25g": (0.05, (1.0,)),
}
SHAPES = (("1x8", 1), ("4x8", 4), ("32x8", 32))
LATENCY_MODELS = ("H100", "H200", "A100")


def _pick(rng: random.Random, table: dict) -> str:
    return rng.choices(list(table), weights=[row[0] for row in table.values()])[0]


def _free_gpus(rng: random.Random, load: float, domain: int) -> tuple[tuple[int, ...], ...]:
    """A host's free GPUs under its block's load: taken whole, taken in part (low indices), or free."""
    draw = rng.random()
    busy = 8 if draw < load * 0.7 else (rng.choice((1, 2, 4, 6)) if draw < load else 0)
    return tuple(tuple(i for i in range(start, start + domain) if i >= busy) for start in range(0, 8, domain))


def _fabric_hosts(
    rng, site: TopologyPath, fabric_id: str, number: int, backbone: float
) -> list[HostSnapshot]:
    """One fabric of 4-12 blocks; the first fabrics cycle through the models so that all appear."""
    kind, model = _pick(rng, FABRICS), list(MODELS)[number] if number < len(MODELS) else _pick(rng, MODELS)
    provider = f"p{number % 40}"
    oversubscription = rng.choice(FABRICS[kind][1])
    low, high = MODELS[model][1]
    base, domain = rng.uniform(low, high), MODELS[model][2]
    hosts = []
    for b in range(rng.randint(4, 12)):
        path = TopologyPath(site.region, site.site_id, fabric_id, f"{fabric_id}-b{b}")
        load = rng.uniform(0.1, 1.0)
        for h in range(rng.randint(16, 32)):
            hosts.append(
                HostSnapshot(
                    host_id=f"{path.block_id}-h{h}",
                    provider_id=provider,
                    gpu_model=model,
                    free_gpus=_free_gpus(rng, load, domain),
                    total_gpus=8,
                    path=path,
                    fabric_kind=kind,
                    fabric_host_gbps=DECLARED_HOST_GBPS[kind],
                    price_per_gpu_hour=round(base * rng.uniform(0.97, 1.03), 2),
                    fabric_oversubscription=oversubscription,
                    site_backbone_gbps=backbone,
                    reliability=round(rng.uniform(0.95, 0.999), 3),
                )
            )
    return hosts


def generate(size: int, seed: int) -> list[HostSnapshot]:
    """`size` hosts in listing order (shuffled, as a marketplace lists them)."""
    rng = random.Random(seed)
    hosts: list[HostSnapshot] = []
    site_number = fabric_number = 0
    while len(hosts) < size:
        region = REGIONS[site_number % len(REGIONS)]
        site = TopologyPath(region, f"{region}-s{site_number}", "", "")
        backbone = rng.choice((12.5, 25.0, 50.0))
        for f in range(rng.randint(2, 6)):
            hosts += _fabric_hosts(rng, site, f"{site.site_id}-f{f}", fabric_number, backbone)
            fabric_number += 1
        site_number += 1
    hosts = hosts[:size]
    rng.shuffle(hosts)
    return hosts


def request(nodes: int, model: str) -> PlacementRequest:
    return PlacementRequest(
        nodes=nodes,
        gpus_per_node=8,
        models=(model,),
        interconnect=("infiniband",),
        interconnect_mode="preferred",
    )


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def time_plans(inventory: Inventory, nodes: int, repeats: int) -> dict:
    """Latency of `repeats` plans of one shape (ms), the model rotating over LATENCY_MODELS."""
    samples, refused = [], 0
    for index in range(repeats):
        started = time.perf_counter()
        result = plan(request(nodes, LATENCY_MODELS[index % len(LATENCY_MODELS)]), inventory)
        samples.append((time.perf_counter() - started) * 1000)
        refused += not isinstance(result, Plan)
    p50, p95 = statistics.median(samples), percentile(samples, 0.95)
    return {"p50_ms": round(p50, 2), "p95_ms": round(p95, 2), "refused": refused}


def quality(hosts: list[HostSnapshot], inventory: Inventory, nodes: int) -> dict:
    """Volt's plan against first-fit (listing order) and first-fit of the cheapest listings."""
    ask = request(nodes, "H100")
    ours, listed = plan(ask, inventory), first_fit(ask, hosts)
    cheapest = first_fit(ask, sorted(hosts, key=lambda h: h.price_per_gpu_hour))
    if not all(isinstance(result, Plan) for result in (ours, listed, cheapest)):
        return {"refused": True}
    return {
        "volt_busbw_gbps": ours.predicted_busbw_gbps,
        "volt_level": ours.spanned_level,
        "volt_allreduce_s": round(ours.predicted_allreduce_s, 4),
        "volt_price_per_hour": ours.price_per_hour,
        "first_fit_busbw_gbps": listed.predicted_busbw_gbps,
        "first_fit_level": listed.spanned_level,
        "first_fit_allreduce_s": round(listed.predicted_allreduce_s, 4),
        "first_fit_price_per_hour": listed.price_per_hour,
        "cheapest_first_busbw_gbps": cheapest.predicted_busbw_gbps,
        "busbw_ratio_vs_first_fit": round(ours.predicted_busbw_gbps / listed.predicted_busbw_gbps, 1),
        "busbw_ratio_vs_cheapest_first": round(ours.predicted_busbw_gbps / cheapest.predicted_busbw_gbps, 1),
    }


def occupancy(hosts: list[HostSnapshot]) -> float:
    free = sum(len(domain) for host in hosts for domain in host.free_gpus)
    return 1 - free / sum(host.total_gpus for host in hosts)


def run_size(size: int, repeats: int, seed: int) -> dict:
    started = time.perf_counter()
    hosts = generate(size, seed)
    generated = time.perf_counter() - started
    started = time.perf_counter()
    inventory = Inventory(hosts)
    inventory.prepare(gpus_per_node=(8,))
    built = time.perf_counter() - started
    gc.freeze()  # the index is long-lived: keep full collections from walking it (a worker should too)
    plan(request(4, "H100"), inventory)  # warm-up
    figures = {
        "hosts": size,
        "gpus": sum(h.total_gpus for h in hosts),
        "occupancy": round(occupancy(hosts), 3),
        "blocks": len({h.path.block_id for h in hosts}),
        "fabrics": len({h.path.fabric_id for h in hosts}),
        "sites": len({h.path.site_id for h in hosts}),
        "regions": len({h.path.region for h in hosts}),
        "generate_s": round(generated, 2),
        "index_build_s": round(built, 3),
        "latency": {name: time_plans(inventory, nodes, repeats) for name, nodes in SHAPES},
        "quality": {name: quality(hosts, inventory, nodes) for name, nodes in SHAPES if nodes > 1},
    }
    started = time.perf_counter()
    inventory.prepare()
    figures["index_build_all_shapes_s"] = round(built + time.perf_counter() - started, 3)
    return figures


def print_table(results: list[dict]) -> None:
    shapes = " ".join(f"{name + ' p50/p95 ms':>22}" for name, _ in SHAPES)
    print(f"{'hosts':>8} {'GPUs':>9} {'busy':>5} {'index s':>8} {shapes}")
    for r in results:
        cells = " ".join(
            f"{r['latency'][n]['p50_ms']:>10.2f} / {r['latency'][n]['p95_ms']:<9.2f}" for n, _ in SHAPES
        )
        print(f"{r['hosts']:>8} {r['gpus']:>9} {r['occupancy']:>5.0%} {r['index_build_s']:>8.2f} {cells}")
    columns = f"{'Volt GB/s (level)':>20} {'first-fit GB/s (level)':>24} {'ratio':>7} {'cheapest-first':>15} {'ratio':>6}"
    print(f"\n{'hosts':>8} {'shape':>6} {columns}")
    for r in results:
        for name, q in r["quality"].items():
            print(f"{r['hosts']:>8} {name:>6} {_quality_cells(q)}")


def _quality_cells(q: dict) -> str:
    if q.get("refused"):
        return "refused: too few free H100 hosts"
    ours = f"{q['volt_busbw_gbps']:g} ({q['volt_level']})"
    theirs = f"{q['first_fit_busbw_gbps']:g} ({q['first_fit_level']})"
    cheap = f"{q['cheapest_first_busbw_gbps']:g}"
    return f"{ours:>20} {theirs:>24} {q['busbw_ratio_vs_first_fit']:>7g} {cheap:>15} {q['busbw_ratio_vs_cheapest_first']:>6g}"


ENDPOINT_TARGET_P50_MS = 300
ENGINE_TARGET_P50_MS = 50


def run_endpoint(hosts: int, requests: int, database_url: str, seed: int) -> dict:
    """Seed PostgreSQL and time the preview endpoint end to end (see the module docstring)."""
    from bench import inventory as seeding  # the inventory bench's seeder and Django set-up

    seeding.recreate_database(database_url)
    seeding.setup_django(database_url)
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    try:
        call_command("migrate", verbosity=0)
        seeded = seeding.seed(hosts, random.Random(seed))
        token = seeding.make_users(seeded)["researcher"]
        client = Client(headers={"authorization": f"Bearer {token}"})
        figures = {"hosts": seeded.hosts, "gpus": seeded.gpus, "seed_s": round(seeded.seconds, 1)}
        for name, nodes in SHAPES:
            figures[name] = _time_preview(client, nodes, requests)
        return figures
    finally:
        connection.close()
        seeding.recreate_database(database_url, drop_only=True)


def _time_preview(client, nodes: int, requests: int) -> dict:
    """Warm: capacity unchanged between requests (the index is reused). Cold: capacity changed before
    every request (a third as many), so each one loads the snapshots and builds the index again."""
    from inventory.services import bump_capacity_version

    warm = _preview_samples(client, nodes, requests, before=lambda: None)
    cold = _preview_samples(client, nodes, max(3, requests // 3), before=bump_capacity_version)
    return {
        "p50_ms": round(percentile(warm["ms"], 0.5), 1),
        "p95_ms": round(percentile(warm["ms"], 0.95), 1),
        "cold_p50_ms": round(percentile(cold["ms"], 0.5), 1),
        "cold_p95_ms": round(percentile(cold["ms"], 0.95), 1),
        "placed": warm["placed"],
        "requests": requests,
    }


def _preview_samples(client, nodes: int, requests: int, before) -> dict:
    samples, placed = [], 0
    for i in range(requests + 2):
        model = LATENCY_MODELS[i % len(LATENCY_MODELS)]
        body = {
            "nodes": nodes,
            "gpus_per_node": 8,
            "gpu_models": [model],
            "interconnect": ["infiniband"],
            "interconnect_mode": "preferred",
        }
        before()
        started = time.perf_counter()
        response = client.post("/api/v1/placements/preview", body, content_type="application/json")
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise SystemExit(f"preview answered {response.status_code}: {response.content[:300]!r}")
        if i >= 2:  # two warm-up requests
            samples.append(elapsed)
            placed += response.json()["placed"]
    return {"ms": samples, "placed": placed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,125000")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--endpoint-hosts", type=int, default=125_000)
    parser.add_argument("--endpoint-requests", type=int, default=30)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/volt_bench")
    args = parser.parse_args()
    results = [run_size(int(size), args.repeats, args.seed) for size in args.sizes.split(",")]
    print_table(results)
    endpoint = None
    if args.endpoint_hosts:
        endpoint = run_endpoint(args.endpoint_hosts, args.endpoint_requests, args.database_url, args.seed)
        print(
            f"\npreview endpoint on PostgreSQL, {endpoint['hosts']:,} hosts / {endpoint['gpus']:,} GPUs "
            f"(target p50 < {ENDPOINT_TARGET_P50_MS} ms):"
        )
        for name, _ in SHAPES:
            e = endpoint[name]
            print(
                f"  {name:>5}: p50 {e['p50_ms']:>7.1f} ms  p95 {e['p95_ms']:>7.1f} ms  placed {e['placed']}/{e['requests']}"
            )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    largest = max(results, key=lambda r: r["hosts"])
    summary = {
        "bench": "placement",
        "repeats": args.repeats,
        "peak_rss_mib": round(peak_mib),
        "sizes": results,
        "endpoint": endpoint,
        "engine_target_met": all(largest["latency"][n]["p50_ms"] < ENGINE_TARGET_P50_MS for n, _ in SHAPES),
        "endpoint_target_met": None
        if endpoint is None
        else all(endpoint[n]["p50_ms"] < ENDPOINT_TARGET_P50_MS for n, _ in SHAPES),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
