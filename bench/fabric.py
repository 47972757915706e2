"""Emulated fabric: measured / predicted busbw of 2-node local clusters at block, fabric and site level,
and of a block pair with one host under `link_degraded:25`, with the probe's run time at each.

    sudo .venv/bin/python bench/fabric.py [--budget-s 5] [--iters 5]

Needs root (or CAP_NET_ADMIN) to shape links; without it the summary says "emulated": false and the
ratios compare plain loopback with the declared fabric (meaningless, as the console says). Sets up its
own SQLite database, local hosts on a 127.0.N.x subnet of its own (other Volts on this machine use
127.0.0.N) and removes its shaping at the end. One site, two NDR fabrics (400 GB/s per host; the first
2:1 oversubscribed, blocks r1 and r2; the second with block q1); the site backbone is 12.5 GB/s:

    block    b0 + b1   (A/r1, A/r1)    400 GB/s  x scale
    fabric   b0 + f1   (A/r1, A/r2)    200 GB/s  x scale
    site     b0 + s1   (A/r1, B/q1)    12.5 GB/s x scale
    degraded b0 + b1, b1 at 25%        predicted as block; flagged below VOLT_PROBE_MIN_FRACTION

Each case runs with only its two hosts available (the others cordoned) and VOLT_SLOW_HOST_REPLACEMENTS=0,
so the probe measures exactly that pair. Target: healthy ratios within 0.7-1.3, the degraded one below
the flag threshold. The last line is the JSON summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402

SUBNET = f"127.0.{150 + os.getpid() % 40}"
CASES = {  # name: (hosts, fault on the second host)
    "block": (("b0", "b1"), None),
    "fabric": (("b0", "f1"), None),
    "site": (("b0", "s1"), None),
    "degraded": (("b0", "b1"), ("link_degraded", "25")),
}
HOSTS = {"b0": ("A", "r1", 2), "b1": ("A", "r1", 3), "f1": ("A", "r2", 4), "s1": ("B", "q1", 5)}


def setup(workdir: Path, budget_s: float, iters: int) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings",
            "DEBUG": "1",  # a dev run like the demo (DEBUG=0 wants a real SECRET_KEY since issue 9)
            "VOLT_ALLOW_LOCAL_HOSTS": "1",  # off by default since issue 9; the bench adds them as Volt
            "VOLT_DATA_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
            "VOLT_AUTO_PROVISION": "0",
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
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from inventory import services
    from voltweb import services as accounts

    owner = get_user_model().objects.create_user("bench-provider")
    provider = services.review_provider(services.register_provider(owner, "Bench Cloud"), approve=True)
    site = services.get_or_create_site("lab1", "bench-region", backbone_gbytes_per_s=12.5)
    fabrics = {
        "A": services.create_fabric(provider, site, "lab1-ib-a", "ib_ndr", 400.0, 2.0, ["r1", "r2"]),
        "B": services.create_fabric(provider, site, "lab1-ib-b", "ib_ndr", 400.0, 1.0, ["q1"]),
    }
    for name, (fabric, block, number) in HOSTS.items():
        request = services.HostRequest(
            name=name,
            block=fabrics[fabric].blocks.get(name=block),
            driver="local",
            address=f"{SUBNET}.{number}",
            price_per_gpu_hour=Decimal("2.00"),
            local_spec=services.default_local_spec("H100", 2, "ib_ndr"),
        )
        services.onboard_host(services.add_host(provider, request, queue=False).pk)
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


def run_case_with_retry(name: str, attempts: int = 2) -> dict:
    for attempt in range(1, attempts + 1):
        try:
            return run_case(name)
        except CaseFailed as failure:
            print(f"{failure} (attempt {attempt}/{attempts})", flush=True)  # only() uncordons the suspects
    raise SystemExit(f"{name}: no cluster came up in {attempts} attempts")


def run_case(name: str) -> dict:
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from clusters import provision, services
    from inventory import services as inventory
    from inventory.models import Host
    from voltweb.models import Team

    hosts, fault = CASES[name]
    only(hosts)
    faulty = Host.objects.get(name=hosts[1])
    if fault:
        inventory.inject_fault(faulty, *fault)
        inventory.sync_local_fabric()
    try:
        user = get_user_model().objects.get(username="bench-researcher")
        started = time.perf_counter()
        cluster = services.request_cluster(
            Team.objects.get(slug="bench"),
            user,
            {"name": f"bench-{name}", "nodes": 2, "gpus_per_node": 2, "gpu_models": ["H100"]},
        )
        services.place_cluster(cluster.pk)
        cluster = provision.provision_cluster(cluster.pk)
        total = time.perf_counter() - started
        if cluster.status != "ready":
            raise CaseFailed(f"{name}: cluster ended {cluster.status}: {cluster.failure_message}")
        events = {e.to_status: e.at for e in cluster.events.all() if e.from_status != e.to_status}
        services.terminate_cluster(cluster, wait=True)
    finally:
        if fault:
            inventory.clear_host_fault(faulty, fault[0])
            inventory.sync_local_fabric()
    result = cluster.probe_result or {}
    measured, predicted = cluster.measured_busbw_gbps, cluster.predicted_busbw_gbps
    return {
        "case": name,
        "level": (cluster.plan or {}).get("spanned_level"),
        "predicted_gbps": round(predicted, 5),
        "measured_gbps": round(measured, 5),
        "ratio": round(measured / predicted, 3),
        "flagged": cluster.bandwidth_flagged,
        "probe_s": round((events["ready"] - events["verifying"]).total_seconds(), 2),
        "probe_run_s": round(result.get("elapsed_s") or 0.0, 2),
        "request_to_ready_s": round(total, 2),
        "largest_kb": (result.get("sizes_bytes") or [0])[-1] // 1024,
        "flag_fraction": settings.VOLT_PROBE_MIN_FRACTION,
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
                rows.append(run_case_with_retry(name))
                print(rows[-1], flush=True)
        finally:
            fabric_emulation.remove(Path(workdir))
        print_table(rows, ["case", "level", "predicted_gbps", "measured_gbps", "ratio", "flagged", "probe_s",
                           "probe_run_s", "largest_kb", "request_to_ready_s"])  # fmt: skip
        by_case = {row["case"]: row for row in rows}
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
                    "ratio": by_case["degraded"]["ratio"],
                    "flagged": by_case["degraded"]["flagged"],
                    "probe_s": by_case["degraded"]["probe_s"],
                },
                "flag_fraction": settings.VOLT_PROBE_MIN_FRACTION,
                "met": all(0.7 <= by_case[lv]["ratio"] <= 1.3 for lv in ("block", "fabric", "site"))
                and by_case["degraded"]["flagged"],
            }
        )


if __name__ == "__main__":
    main()
