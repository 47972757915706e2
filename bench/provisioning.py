"""Provisioning: request-to-READY of 1-, 2- and 4-node local clusters against plain `ray start`.

    .venv/bin/python bench/provisioning.py [--sizes 1,2,4] [--probe-max-mb 64] [--repeats 5]

Sets up its own SQLite database and local hosts (real onboarding through the simulated nvidia-smi) in a
temporary folder, then for each size:

- Volt: request a cluster (services.request_cluster), place and provision it as the Celery tasks do, and
  time request → READY. The all-reduce probe is part of that; its own run time is the VERIFYING → READY
  span of the timeline.
- Baseline: on the same hosts, `ray start` of the head, then every worker at once, by hand (the same
  commands with every port and temp dir set, ray_nodes.start_*), until the head reports all nodes ALIVE.

Each size runs `--repeats` rounds (5), Volt and the baseline alternating which goes first; medians count
and the spread (min-max) is reported with them. Targets: excluding the probe, Volt's time within
1.3 x the baseline plus the probe's run time; including it (request → READY, the probe sized to
VOLT_PROBE_BUDGET_S), within 2 x plain `ray start`. Hosts sit on a 127.0.N.x subnet of the bench's own;
run as root their links are emulated (shaped to NDR x VOLT_LOCAL_FABRIC_SCALE) and the shaping is
removed at the end. Plain `ray start` measured here earlier: ~10 / 13 / 20 s for 1 / 2 / 4 nodes. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

TARGET_FACTOR = 1.3
TARGET_FACTOR_WITH_PROBE = 2.0
SUBNET = f"127.0.{110 + os.getpid() % 40}"


def setup(workdir: Path, hosts: int) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings",
            "DEBUG": "1",  # a dev run like the demo (DEBUG=0 wants a real SECRET_KEY since issue 9)
            "VOLT_ALLOW_LOCAL_HOSTS": "1",  # off by default since issue 9; the bench adds them as Volt
            "VOLT_DATA_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
            "VOLT_AUTO_PROVISION": "0",
            # No worker runs here: tasks the services enqueue must not wait in a real broker for the
            # next Volt (a demo) to pick up. The bench calls the services itself.
            "CELERY_BROKER_URL": "memory://",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    seed_hosts(hosts)


def seed_hosts(count: int) -> None:
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from inventory import services
    from voltweb import services as accounts

    owner = get_user_model().objects.create_user("bench-provider")
    provider = services.review_provider(services.register_provider(owner, "Bench Cloud"), approve=True)
    site = services.get_or_create_site("lab1", "bench-region")
    fabric = services.create_fabric(provider, site, "lab1-ib", "ib_ndr", 400.0, 1.0, ["r1"])
    for i in range(count):
        request = services.HostRequest(
            name=f"node-{i}",
            block=fabric.blocks.get(),
            driver="local",
            address=f"{SUBNET}.{i + 2}",  # other Volts on this machine use 127.0.0.N
            price_per_gpu_hour=Decimal("2.00"),
            local_spec=services.default_local_spec("H100", 2, "ib_ndr"),
        )
        services.onboard_host(services.add_host(provider, request, queue=False).pk)
    services.sync_local_fabric()
    researcher = get_user_model().objects.create_user("bench-researcher")
    accounts.add_member(accounts.create_team("Bench", "bench"), researcher)


def volt_run(nodes: int) -> dict:
    """Request → READY through the services the Celery tasks call; returns seconds and the probe's share."""
    from django.contrib.auth import get_user_model

    from clusters import provision, services
    from voltweb.models import Team

    user = get_user_model().objects.get(username="bench-researcher")
    started = time.perf_counter()
    cluster = services.request_cluster(
        Team.objects.get(slug="bench"),
        user,
        {"name": f"bench-{nodes}", "nodes": nodes, "gpus_per_node": 2, "gpu_models": ["H100"]},
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    total = time.perf_counter() - started
    if cluster.status != "ready":
        raise SystemExit(f"{nodes}-node cluster ended {cluster.status}: {cluster.failure_message}")
    events = {e.to_status: e.at for e in cluster.events.all() if e.from_status != e.to_status}
    probe = (events["ready"] - events["verifying"]).total_seconds() if "verifying" in events else 0.0
    hosts = [n.host for n in cluster.nodes.filter(released_at__isnull=True).select_related("host__provider")]
    services.terminate_cluster(cluster, wait=True)
    result = cluster.probe_result or {}
    return {
        "probe_phases_s": result.get("phases_s", {}),
        "probe_wall_s": result.get("wall_s"),
        "seconds": round(total, 2),
        "probe_seconds": round(probe, 2),
        "busbw_gbps": cluster.measured_busbw_gbps,
        "slow_hosts_replaced": cluster.slow_hosts_replaced,
        "hosts": hosts,
    }


def baseline_run(hosts, slot_base: int) -> float:
    """Plain `ray start`: the head, then all workers at once, until the head reports every node ALIVE."""
    from clusters.provisioning import ray_nodes
    from inventory import local_runtime, services
    from inventory.drivers.base import fan_out

    drivers = [services.driver_for(host) for host in hosts]
    cluster_id = f"baseline-{len(hosts)}"
    options = [
        {
            "cluster_id": cluster_id,
            "ports": ray_nodes.ports_for(slot_base + i),
            "num_gpus": 2,
            "temp_dir": f"/tmp/volt-ray/base-{slot_base + i}",
            "python": local_runtime.python_for_local_hosts(),  # the Python Volt's nodes run from
            "env": {"GLOO_SOCKET_IFNAME": "lo"},
        }
        for i in range(len(hosts))
    ]
    started = time.perf_counter()
    try:
        head = ray_nodes.start_head(drivers[0], **options[0])
        results = fan_out(
            drivers[1:],
            lambda d: ray_nodes.start_worker(d, head_address=head.gcs_address, **options[drivers.index(d)]),
        )
        if any(isinstance(r, Exception) for r in results):
            raise SystemExit(f"baseline worker failed: {results}")
        ray_nodes.wait_for_nodes(  # polled as often as Volt polls
            head.dashboard_url, len(hosts), 120, expected_ips={h.address for h in hosts}, poll_s=0.3
        )
        return round(time.perf_counter() - started, 2)
    finally:
        fan_out(drivers[1:], lambda d: ray_nodes.stop_node(d, cluster_id))
        ray_nodes.stop_node(drivers[0], cluster_id)
        for driver in drivers:
            driver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--probe-max-mb", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=5, help="rounds per size (medians reported; order alternates)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    os.environ["VOLT_PROBE_MAX_MB"] = str(args.probe_max_mb)
    os.environ["VOLT_PROBE_ITERS"] = "5"
    with tempfile.TemporaryDirectory(prefix="volt-bench-prov-") as workdir:
        setup(Path(workdir), max(sizes))
        try:
            rows = _measure(sizes, args.repeats)
        finally:
            from inventory import fabric_emulation

            fabric_emulation.remove(Path(workdir))
    print(
        json.dumps(
            {
                "bench": "provisioning",
                "probe_max_mb": args.probe_max_mb,
                "repeats": args.repeats,
                "target_factor": TARGET_FACTOR,
                "target_factor_with_probe": TARGET_FACTOR_WITH_PROBE,
                "load_avg_1m": round(os.getloadavg()[0], 1),
                "sizes": rows,
                "met": all(r["met"] for r in rows),
                "met_with_probe": all(r["met_with_probe"] for r in rows),
            }
        )
    )


def _median_or_none(values) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def _spread(values) -> list[float]:
    return [round(min(values), 2), round(max(values), 2)]


def _measure(sizes: list[int], repeats: int) -> list[dict]:
    """Volt and plain `ray start` per size, alternating which goes first; medians and spreads."""
    rows = []
    for nodes in sizes:
        volts, bases = [], []
        for round_ in range(repeats):
            if round_ % 2:  # every other round the baseline goes first: neither always meets a warm cache
                bases.append(baseline_run(_hosts_for(nodes), slot_base=80))
            volt = volt_run(nodes)
            hosts = volt.pop("hosts")
            volts.append(volt)
            if not round_ % 2:
                bases.append(baseline_run(hosts, slot_base=80))
            print(
                f"  {nodes} node(s) round {round_ + 1}: Volt {volt['seconds']} s (probe {volt['probe_seconds']} s:"
                f" wall {volt['probe_wall_s']} s, {volt['probe_phases_s']}), ray start {bases[-1]} s",
                flush=True,
            )
        volt_s = statistics.median(v["seconds"] for v in volts)
        probe_s = statistics.median(v["probe_seconds"] for v in volts)
        base = statistics.median(bases)
        allowed = TARGET_FACTOR * base + probe_s
        rows.append(
            {
                "nodes": nodes,
                "volt_s": volt_s,
                "probe_s": probe_s,
                "ray_start_s": base,
                "allowed_s": round(allowed, 2),
                "met": volt_s <= allowed,
                "volt_over_ray_start_excl_probe": round((volt_s - probe_s) / base, 2),
                "volt_over_ray_start_incl_probe": round(volt_s / base, 2),
                "met_with_probe": volt_s <= TARGET_FACTOR_WITH_PROBE * base,
                "volt_spread_s": _spread([v["seconds"] for v in volts]),
                "probe_spread_s": _spread([v["probe_seconds"] for v in volts]),
                "ray_start_spread_s": _spread(bases),
                "probe_busbw_gbps": statistics.median(v["busbw_gbps"] or 0.0 for v in volts) or None,
                "probe_wall_s": _median_or_none([v["probe_wall_s"] for v in volts]),
                "probe_phases_s": {
                    phase: _median_or_none([v["probe_phases_s"].get(phase) for v in volts])
                    for phase in sorted({p for v in volts for p in v["probe_phases_s"]})
                },
                "volt_runs_s": [v["seconds"] for v in volts],
                "slow_hosts_replaced": sum(v["slow_hosts_replaced"] for v in volts),
                "ray_start_runs_s": bases,
            }
        )
        print(
            f"{nodes} node(s): Volt request→READY {volt_s:6.1f} s (probe {probe_s:.1f} s)"
            f" | plain ray start {base:5.1f} s | allowed {allowed:5.1f} s | "
            f"{'met' if rows[-1]['met'] else 'NOT met'} | with the probe {volt_s / base:.2f}x "
            f"({'met' if rows[-1]['met_with_probe'] else 'NOT met'})  (medians of {repeats})",
            flush=True,
        )
    return rows


def _hosts_for(nodes: int) -> list:
    """The cheapest `nodes` hosts: the ones Volt's placement takes for a cluster of that size."""
    from inventory.models import Host

    return list(Host.objects.select_related("provider").order_by("name")[:nodes])


if __name__ == "__main__":
    main()
