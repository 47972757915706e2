"""Emulated fabric: every bandwidth figure against the wire, on the demo's inventory.

    sudo .venv/bin/python bench/fabric.py [--budget-s 5] [--iters 5]

Needs root (or CAP_NET_ADMIN) to shape links; without it the summary says "emulated": false and the
ratios compare plain loopback with the declared fabric (meaningless, as the console says). Sets up its
own SQLite database and the demo's eleven hosts (`seed_demo.INVENTORY`: two providers, two sites in two
regions, NDR / RoCE / Ethernet fabrics) on a 127.0.N.x subnet of its own (other Volts on this machine
use 127.0.0.N), and removes its shaping at the end. Each case runs with only its hosts available (the
others cordoned) and VOLT_SLOW_HOST_REPLACEMENTS=0, so the probe measures exactly those hosts:

    block      iad1-h100-01 + iad1-h100-02        one NDR block               400 GB/s x scale
    fabric     iad1-h100-01 + iad1-h100-04        two blocks, 2:1 spine       200 GB/s x scale
    site       iad1-h100-01 + iad1-h100-11        two fabrics of iad1         12.5 GB/s x scale
    region     iad1-h100-01 + iad2-h100-01        two sites of us-east        1.25 GB/s x scale
    global     iad1-h100-01 + ams1-h100-01        us-east and eu-west         0.125 GB/s x scale
    mixed      iad1-h100-01, -02 and -04          a block and the next one    200 GB/s x scale
    degraded   the mixed three, iad1-h100-04 at link_degraded:25: flagged, and that host named (two
               nodes share their one link, so naming a host takes three)
    after      the fabric pair again once the fault is cleared: the faulty probe must not have lowered
               what placement predicts for that fabric (issue 23: a false "266%")
    recovery   a block pair whose head is killed and replaced from the next block: the plan, the
               prediction and the probe after the recovery agree (no false flag)
    job        the demo job on the block pair: its own busbw samples against the probe (median)

The demo's own hosts give no same-model pair across two fabrics of a site or two sites of a region, so
the bench adds iad1-h100-11 (a second NDR fabric in iad1) and iad2-h100-01 (a second us-east site).
Target: every ratio (measured / predicted; job / probe) within 0.7-1.3, the degraded case flagged with
its host named. The last line is the JSON summary: today's keys (levels block/fabric/site, degraded,
met) and `pairs` [{"levels", "predicted_gbps", "measured_gbps", "ratio"}], `recovery`, `job_vs_probe`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402

SUBNET = f"127.0.{150 + os.getpid() % 40}"
# name: (hosts, a link fault on the last host)
CASES = {
    "block": (("iad1-h100-01", "iad1-h100-02"), None),
    "fabric": (("iad1-h100-01", "iad1-h100-04"), None),
    "site": (("iad1-h100-01", "iad1-h100-11"), None),
    "region": (("iad1-h100-01", "iad2-h100-01"), None),
    "global": (("iad1-h100-01", "ams1-h100-01"), None),
    "mixed": (("iad1-h100-01", "iad1-h100-02", "iad1-h100-04"), None),
    "degraded": (("iad1-h100-01", "iad1-h100-02", "iad1-h100-04"), ("link_degraded", "25")),
    "after": (("iad1-h100-01", "iad1-h100-04"), None),
}
# The demo's hosts give no pair of one GPU model across two fabrics of a site or two sites of a region:
# the bench adds one H100 host in a second NDR fabric of iad1 and one in a second us-east site.
EXTRA = {
    "Northwind GPU Cloud": [
        (
            "iad1",
            "us-east",
            "iad1-ib-b",
            "ib_ndr",
            400.0,
            1.0,
            {"q01": [("iad1-h100-11", "H100", 8, "2.49")]},
        ),
        ("iad2", "us-east", "iad2-ib", "ib_ndr", 400.0, 1.0, {"c01": [("iad2-h100-01", "H100", 8, "2.49")]}),
    ]
}
RECOVERY_HOSTS = ("iad1-h100-01", "iad1-h100-02", "iad1-h100-04")  # the third is the only replacement
HEALTHY = ("block", "fabric", "site", "region", "global", "mixed", "after")


def in_range(ratio: float | None) -> bool:
    return ratio is not None and 0.7 <= ratio <= 1.3


def setup(workdir: Path, budget_s: float, iters: int) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings",
            "DEBUG": "1",  # a dev run like the demo (DEBUG=0 wants a real SECRET_KEY since issue 9)
            "VOLT_ALLOW_LOCAL_HOSTS": "1",  # off by default since issue 9; the bench adds them as Volt
            "VOLT_DATA_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
            "VOLT_AUTO_PROVISION": "0",
            "VOLT_AUTO_RECOVER": "0",  # the recovery case calls the recovery task body itself
            "CELERY_BROKER_URL": "memory://",  # the bench calls the services itself; no worker
            "VOLT_PROBE_BUDGET_S": str(budget_s),
            "VOLT_PROBE_ITERS": str(iters),
            "VOLT_SLOW_HOST_REPLACEMENTS": "0",
            "VOLT_NODE_JOIN_TIMEOUT_S": "120",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    seed()


def seed() -> None:
    """The demo's providers, fabrics and hosts (seed_demo.INVENTORY), each host on this bench's subnet."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from inventory import services
    from inventory.management.commands.seed_demo import INVENTORY
    from voltweb import services as accounts

    number = 2
    providers = {}
    for provider_name, fabrics in [*INVENTORY.items(), *EXTRA.items()]:
        if provider_name not in providers:
            owner = get_user_model().objects.create_user(f"bench-{number}")
            registered = services.register_provider(owner, provider_name)
            providers[provider_name] = services.review_provider(registered, approve=True)
        provider = providers[provider_name]
        for site_name, region, fabric_name, kind, bandwidth, oversub, blocks in fabrics:
            site = services.get_or_create_site(site_name, region)
            fabric = services.create_fabric(
                provider, site, fabric_name, kind, bandwidth, oversub, list(blocks)
            )
            for block_name, hosts in blocks.items():
                for host_name, model, gpus, price in hosts:
                    request = services.HostRequest(
                        name=host_name,
                        block=fabric.blocks.get(name=block_name),
                        driver="local",
                        address=f"{SUBNET}.{number}",
                        price_per_gpu_hour=Decimal(price),
                        local_spec=services.default_local_spec(model, gpus, kind),
                    )
                    services.onboard_host(services.add_host(provider, request, queue=False).pk)
                    number += 1
    services.sync_local_fabric()
    researcher = get_user_model().objects.create_user("bench-researcher")
    accounts.add_member(accounts.create_team("Bench", "bench"), researcher)


def only(names: tuple[str, ...]) -> None:
    """Make exactly these hosts available: placement then has to take them."""
    from inventory import services
    from inventory.models import Host

    for host in Host.objects.all():
        wanted = "available" if host.name in names else "cordoned"
        if host.state != wanted:
            services.act_on_host(host, "uncordon" if wanted == "available" else "cordon")


class CaseFailed(RuntimeError):
    """A case's cluster did not come up (on a shared box: another Volt took its Ray ports meanwhile)."""


def with_retry(name: str, run, attempts: int = 2) -> dict:
    for attempt in range(1, attempts + 1):
        try:
            return run(name)
        except CaseFailed as failure:
            print(f"{failure} (attempt {attempt}/{attempts})", flush=True)  # only() uncordons the suspects
    raise SystemExit(f"{name}: no cluster came up in {attempts} attempts")


def ready_cluster(name: str, hosts: tuple[str, ...], nodes: int | None = None):
    from django.contrib.auth import get_user_model

    from clusters import provision, services
    from voltweb.models import Team

    only(hosts)
    user = get_user_model().objects.get(username="bench-researcher")
    cluster = services.request_cluster(
        Team.objects.get(slug="bench"),
        user,
        {"name": f"bench-{name}", "nodes": nodes or len(hosts), "gpus_per_node": 2, "gpu_models": ["H100"]},
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    if cluster.status != "ready":
        raise CaseFailed(f"{name}: cluster ended {cluster.status}: {cluster.failure_message}")
    return cluster, user


def figures(name: str, cluster) -> dict:
    from django.conf import settings

    from clusters.probes import allreduce

    result = cluster.probe_result or {}
    measured, predicted = cluster.measured_busbw_gbps, cluster.predicted_busbw_gbps
    slow = allreduce.slowest_host(result, settings.VOLT_SLOW_HOST_FRACTION) if result else None
    names = {n.host.address: n.host.name for n in cluster.nodes.select_related("host")}
    return {
        "case": name,
        "level": (cluster.plan or {}).get("spanned_level"),
        "predicted_gbps": round(predicted, 6),
        "measured_gbps": round(measured, 6),
        "ratio": round(measured / predicted, 3),
        "flagged": cluster.bandwidth_flagged,
        "blamed": names.get(slow["node_ip"], slow["node_ip"]) if slow else None,
        "probe_run_s": round(result.get("elapsed_s") or 0.0, 2),
        "largest_kb": (result.get("sizes_bytes") or [0])[-1] // 1024,
    }


def run_case(name: str) -> dict:
    from clusters import services
    from inventory import services as inventory
    from inventory.models import Host

    hosts, fault = CASES[name]
    faulty = Host.objects.get(name=hosts[-1])
    if fault:
        inventory.inject_fault(faulty, *fault)
        inventory.sync_local_fabric()
    try:
        started = time.perf_counter()
        cluster, _ = ready_cluster(name, hosts)
        total = time.perf_counter() - started
        events = {e.to_status: e.at for e in cluster.events.all() if e.from_status != e.to_status}
        services.terminate_cluster(cluster, wait=True)
    finally:
        if fault:
            inventory.clear_host_fault(faulty, fault[0])
            inventory.sync_local_fabric()
    return {
        **figures(name, cluster),
        "probe_s": round((events["ready"] - events["verifying"]).total_seconds(), 2),
        "request_to_ready_s": round(total, 2),
    }


def run_recovery(name: str) -> dict:
    """A block pair; its head's Ray processes killed; the sweep and the recovery task body as beat and a
    worker run them; the figures of the cluster re-formed with the next block's host."""
    from clusters import recovery, services
    from clusters.models import Cluster
    from clusters.provision import active_nodes, ray_cluster_id
    from clusters.provisioning import ray_nodes
    from clusters.telemetry import watch
    from inventory import services as inventory

    cluster, _ = ready_cluster(name, RECOVERY_HOSTS, nodes=2)
    before = figures("before", cluster)
    head = next(n for n in active_nodes(cluster) if n.is_head)
    with inventory.driver_for(head.host) as driver:
        handle = ray_nodes.find_node(driver, ray_cluster_id(cluster))
    os.killpg(handle.pgid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while watch.sweep_cluster(cluster.pk) != "degraded":
        if time.monotonic() > deadline:
            raise SystemExit("recovery: the killed head was not detected within 120 s")
        time.sleep(1.0)
    status = recovery.recover_cluster(cluster.pk)
    cluster = Cluster.objects.get(pk=cluster.pk)
    if status != "ready":
        services.terminate_cluster(cluster, wait=True)
        raise CaseFailed(f"{name}: recovery ended {status}: {cluster.failure_message}")
    after = figures(name, cluster)
    after["killed"] = head.host.name
    after["before"] = {k: before[k] for k in ("level", "predicted_gbps", "measured_gbps", "ratio")}
    after["hosts"] = sorted(n.host.name for n in active_nodes(cluster))
    services.terminate_cluster(cluster, wait=True)
    return after


def run_job(name: str) -> dict:
    """The demo job on a block pair, a busbw event every 2 steps: its samples against the cluster's probe."""
    from clusters import services
    from clusters.models import MetricSample
    from jobs import services as jobs
    from jobs.models import Job

    cluster, user = ready_cluster(name, CASES["block"][0])
    entrypoint = jobs.demo_entrypoint(30, 100, 1, 0.05) + " --busbw-every 2"
    job = jobs.submit_job(cluster, user, entrypoint, working_dir=jobs.WORKLOADS_DIR, checkpoint_every=100,
                          is_demo=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job.pk)
        if job.status == "pending" and not job.ray_submission_id:
            jobs.start_job(job.pk)
        elif job.ray_submission_id and job.status in ("pending", "running"):
            jobs.poll_job(job.pk)
        if Job.objects.get(pk=job.pk).status in ("succeeded", "failed", "stopped"):
            break
        time.sleep(1.0)
    job = Job.objects.get(pk=job.pk)
    samples = sorted(
        MetricSample.objects.filter(cluster=cluster, series="busbw", source="job").values_list(
            "value", flat=True
        )
    )
    services.terminate_cluster(cluster, wait=True)
    if job.status != "succeeded" or not samples:
        raise SystemExit(f"job: {job.status} {job.status_reason} with {len(samples)} busbw samples")
    median = samples[len(samples) // 2]
    probe = cluster.measured_busbw_gbps
    return {
        "case": name,
        "probe_gbps": round(probe, 6),
        "job_median_gbps": round(median, 6),
        "job_min_gbps": round(samples[0], 6),
        "job_max_gbps": round(samples[-1], 6),
        "samples": len(samples),
        "ratio": round(median / probe, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=5.0, help="VOLT_PROBE_BUDGET_S (the default)")
    parser.add_argument("--iters", type=int, default=5, help="VOLT_PROBE_ITERS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="volt-bench-fabric-") as workdir:
        setup(Path(workdir), args.budget_s, args.iters)
        from django.conf import settings

        from inventory import fabric_emulation
        from inventory import services as inventory

        emulated = inventory.links_emulated()
        print(
            f"links emulated: {emulated} ({inventory.unavailable_reason() or 'shaped on lo'}); "
            f"scale {settings.VOLT_LOCAL_FABRIC_SCALE}; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        try:
            rows = []
            for name in CASES:
                rows.append(with_retry(name, run_case))
                print(rows[-1], flush=True)
            recovered = with_retry("recovery", run_recovery)
            print(recovered, flush=True)
            job = with_retry("job", run_job)
            print(job, flush=True)
        finally:
            fabric_emulation.remove(Path(workdir))
        print_table([*rows, recovered], ["case", "level", "predicted_gbps", "measured_gbps", "ratio", "flagged",
                                         "blamed", "probe_run_s", "largest_kb"])  # fmt: skip
        print(f"job: median busbw {job['job_median_gbps']} GB/s over {job['samples']} samples "
              f"(min {job['job_min_gbps']}, max {job['job_max_gbps']}); probe {job['probe_gbps']}; "
              f"ratio {job['ratio']}")  # fmt: skip
        by_case = {row["case"]: row for row in rows}
        degraded = by_case["degraded"]
        pairs = [
            {"levels": f"{row['case']}:{row['level']}", "predicted_gbps": row["predicted_gbps"],
             "measured_gbps": row["measured_gbps"], "ratio": row["ratio"]}
            for row in [*(by_case[name] for name in HEALTHY), recovered]
        ]  # fmt: skip
        emit_json(
            {
                "bench": "fabric",
                "emulated": emulated,
                "scale": settings.VOLT_LOCAL_FABRIC_SCALE,
                "budget_s": args.budget_s,
                "load_avg_1m": round(os.getloadavg()[0], 1),
                "levels": {
                    level: {
                        "ratio": by_case[level]["ratio"],
                        "probe_s": by_case[level]["probe_s"],
                        "measured_gbps": by_case[level]["measured_gbps"],
                        "predicted_gbps": by_case[level]["predicted_gbps"],
                    }
                    for level in ("block", "fabric", "site")
                },
                "degraded": {
                    "ratio": degraded["ratio"],
                    "flagged": degraded["flagged"],
                    "blamed": degraded["blamed"],
                    "probe_s": degraded["probe_s"],
                },
                "pairs": pairs,
                "recovery": {
                    k: recovered[k] for k in ("killed", "hosts", "level", "ratio", "flagged", "before")
                },
                "job_vs_probe": {
                    k: job[k] for k in ("probe_gbps", "job_median_gbps", "job_max_gbps", "samples", "ratio")
                },  # fmt: skip
                "flag_fraction": settings.VOLT_PROBE_MIN_FRACTION,
                "met": all(in_range(pair["ratio"]) for pair in pairs)
                and not recovered["flagged"]
                and degraded["flagged"]
                and degraded["blamed"] == CASES["degraded"][0][-1]
                and in_range(job["ratio"]),
            }
        )


if __name__ == "__main__":
    main()
