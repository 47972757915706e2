"""The lab: Volt's runtime bootstrap, request → READY against doing it by hand, and a machine powered off.

    sudo .venv/bin/python bench/lab.py [--lab 90] [--rounds 2] [--steps 60] [--step-sleep 0.4]

Root only (the lab makes namespaces). Brings up a lab of 8 machines (the default topology: two providers,
four machines each) under lab number --lab, with its own SQLite database in a temporary folder, and:

- bootstrap: Volt's runtime (`inventory.host_runtime.install`: where the control plane has mksquashfs, the
  runtime's image copied over SSH, checked, mounted under a venv made on the machine; else the wheelhouse
  copied and pip-installed there: `method` says which) on one fresh machine alone (one_s), then on all 8
  fresh machines at once (parallel_8_s; the first machine's runtime and copied files are removed first).
  The wheelhouse and the image are built before either is timed. Target: parallel_8_s <= 3 x one_s;
- ready: northwind's four machines onboarded over SSH with their lab addresses as private addresses, then,
  alternating for --rounds: Volt (request → placement → Ray over SSH → READY, the probe included; volt_s
  is without the probe, probe_s the probe) and by hand on the same machines (`ray start` over SSH from the
  runtime, head then workers at once, until the head lists all four ALIVE). Target: volt_s <= 1.3 x
  by_hand_s. Medians;
- power_off: the demo job (bench/recovery.py's scenario) on a 3-node cluster of the four machines; once
  it passed two checkpoints a worker's machine is powered off (`lab power-off`: every process of it ends).
  This process plays Celery (watch sweeps, the recovery task, the job's poll). detected_s, ready_s
  (cluster READY again), resumed_s (first step after the resume) from the power-off; params_match: the
  final parameters bitwise those of an uninterrupted run. The fourth machine is the spare.

The lab is taken down at the end whatever happened. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402

SHARED = "/mnt/volt-shared"


def topology() -> dict:
    """8 machines of two GPUs: northwind's four H100 machines (blocks r1, r2) form the clusters; helios's
    four (L40S) only bootstrap. Each machine's link rates are the lab's (block, fabric, site)."""
    machines = []
    for provider, prefix, fabric, model in (("northwind", "nw", "iad1-ndr", "H100"),
                                            ("helios", "he", "ord1-roce", "L40S")):  # fmt: skip
        for k in range(4):
            machines.append({"name": f"{prefix}-{k + 1:02d}", "provider": provider, "fabric": fabric,
                             "block": f"r{k // 2 + 1}", "gpu_model": model, "gpu_count": 2})  # fmt: skip
    return {
        "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5},
                  "ord1": {"region": "us-central", "backbone_gbytes_per_s": 12.5}},
        "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400.0,
                                 "oversubscription": 2.0},
                    "ord1-roce": {"site": "ord1", "kind": "roce", "per_host_gbytes_per_s": 200.0,
                                  "oversubscription": 2.0}},
        "machines": machines,
    }  # fmt: skip


def setup(workdir: Path) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings",
            "DEBUG": "1",
            "VOLT_DATA_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
            "VOLT_AUTO_PROVISION": "0",
            "VOLT_AUTO_RECOVER": "0",  # this process runs the recovery task body
            "CELERY_BROKER_URL": "memory://",
            "VOLT_PROBE_MAX_MB": os.environ.get("VOLT_PROBE_MAX_MB", "8"),
            "VOLT_SLOW_HOST_REPLACEMENTS": "0",
            "VOLT_SSH_SHARED_DIR": SHARED,
            "VOLT_NODE_JOIN_TIMEOUT_S": "150",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def lab(number: int, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", "lab", *args, "--lab", str(number)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=os.environ,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"manage.py lab {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def machine_driver(status, name: str):
    from inventory.drivers.ssh import SshDriver

    machine = status.machine(name)
    return SshDriver(host=machine.gate, port=machine.gate_port, username=status.login_user,
                     private_key=status.key_path.read_text(), known_host_key=machine.host_key,
                     connect_timeout=10, command_timeout=120)  # fmt: skip


def bootstrap(status, names: list[str]) -> dict:
    from inventory import host_runtime, runtime_build
    from inventory.discovery.probe import host_system

    wheelhouse = host_runtime.build_wheelhouse()
    # The image (where the control plane can build it) is built before either part is timed, as the
    # wheelhouse is: built once per pin set, then only copied.
    image = None if runtime_build.image_unavailable() else runtime_build.build_image(wheelhouse)
    methods = []

    def boot(name: str) -> float:
        driver = machine_driver(status, name)
        try:
            system = host_system(driver, 30).as_json()
            started = time.perf_counter()
            runtime = host_runtime.install(driver, system, wheelhouse=wheelhouse)
            if not runtime.ready or not runtime.installed_now:
                raise SystemExit(f"{name}: the runtime was not installed: {runtime.problems}")
            methods.append(runtime.method)
            return time.perf_counter() - started
        finally:
            driver.close()

    one = boot(names[0])
    wipe = machine_driver(status, names[0])
    try:
        wipe.run(
            "for m in /opt/volt/runtime-*/image; do mountpoint -q $m && sudo -n umount $m; done; "
            "sudo -n rm -rf /opt/volt ~/.volt",
            timeout=120,
        )
    finally:
        wipe.close()
    started = time.perf_counter()
    with ThreadPoolExecutor(len(names)) as pool:
        each = list(pool.map(boot, names))
    parallel = time.perf_counter() - started
    return {
        "one_s": round(one, 1),
        "parallel_8_s": round(parallel, 1),
        "ratio": round(parallel / one, 2),
        "each_parallel_s": [round(s, 1) for s in each],
        "method": "+".join(sorted(set(methods))),
        "wheelhouse_mb": round(wheelhouse.size / 1e6),
        "image_mb": round(image.size / 1e6) if image else None,
        "target_ratio": 3.0,
        "met": parallel <= 3.0 * one,
    }


def onboard(status, names: list[str], scale: float):
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from inventory import runtimes, services
    from voltweb import services as accounts

    owner = get_user_model().objects.create_user("bench-provider")
    provider = services.review_provider(services.register_provider(owner, "Northwind"), approve=True)
    # Declared as the lab delivers them: its topology's rates times its scale (as seed_demo --lab does).
    site = services.get_or_create_site("iad1", "us-east", 12.5 * scale)
    fabric = services.create_fabric(provider, site, "iad1-ndr", "ib_ndr", 400.0 * scale, 2.0, ["r1", "r2"])
    blocks = {b.name: b for b in fabric.blocks.all()}
    hosts = []
    for number, name in enumerate(names):
        machine = status.machine(name)
        request = services.HostRequest(
            name=name, block=blocks["r1" if number < 2 else "r2"], driver="ssh",
            price_per_gpu_hour=Decimal("2.00"), address=machine.gate, ssh_port=machine.gate_port,
            ssh_user=status.login_user, ssh_private_key=status.key_path.read_text(),
            private_address=machine.address,
        )  # fmt: skip
        host = services.onboard_host(services.add_host(provider, request, queue=False).pk)
        if host.state != "available":
            raise SystemExit(f"{name}: onboarding failed: {host.error_message}")
        host = runtimes.install_runtime(host.pk)  # verifies the runtime the bootstrap put there
        if host.runtime.get("state") != "ready":
            raise SystemExit(f"{name}: runtime {host.runtime}")
        hosts.append(host)
    researcher = get_user_model().objects.create_user("bench-researcher")
    accounts.add_member(accounts.create_team("Bench", "bench"), researcher)
    return hosts


def by_hand(hosts) -> float:
    """`ray start` over SSH from the runtime on each machine (head, then the workers at once) until the head
    lists every node ALIVE: what a person with the runtime in place would do."""
    from clusters.provisioning import ray_nodes
    from inventory import runtimes, services, tunnels
    from inventory.drivers.base import fan_out

    drivers = [services.driver_for(host) for host in hosts]
    cluster_id = "by-hand"
    options = [
        {"cluster_id": cluster_id, "ports": ray_nodes.ports_for(90), "num_gpus": 2,
         "temp_dir": "/tmp/volt-by-hand", "python": runtimes.python_of(host), "node_ip": host.node_ip}
        for host in hosts
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        head = ray_nodes.start_head(drivers[0], **options[0])
        results = fan_out(
            drivers[1:],
            lambda d: ray_nodes.start_worker(d, head_address=head.gcs_address, **options[drivers.index(d)]),
        )
        if any(isinstance(r, Exception) for r in results):
            raise SystemExit(f"by hand: a worker failed: {results}")
        ray_nodes.wait_for_nodes(
            tunnels.http_url(hosts[0], head.dashboard_url), len(hosts), 150,
            expected_ips={h.node_ip for h in hosts}, poll_s=0.3,
        )  # fmt: skip
        return time.perf_counter() - started
    finally:
        fan_out(drivers, lambda d: ray_nodes.stop_node(d, cluster_id))
        for driver in drivers:
            driver.close()


def ready(hosts, rounds: int) -> dict:
    from bench.provisioning import volt_run

    volt, probe, hand = [], [], []
    for number in range(rounds):
        order = ("volt", "hand") if number % 2 == 0 else ("hand", "volt")
        for what in order:
            if what == "volt":
                run = volt_run(len(hosts))
                volt.append(run["seconds"] - run["probe_seconds"])
                probe.append(run["probe_seconds"])
            else:
                hand.append(by_hand(hosts))
    volt_s, hand_s = statistics.median(volt), statistics.median(hand)
    return {
        "nodes": len(hosts),
        "volt_s": round(volt_s, 2),
        "probe_s": round(statistics.median(probe), 2),
        "by_hand_s": round(hand_s, 2),
        "ratio": round(volt_s / hand_s, 2),
        "rounds": rounds,
        "target_ratio": 1.3,
        "met": volt_s <= 1.3 * hand_s,
    }


def power_off(number: int, args) -> dict:
    from bench.recovery import cluster_and_user, reference_run, scenario
    from clusters import services
    from clusters.provision import active_nodes

    def fault(cluster, head: bool) -> str:
        node = next(n for n in active_nodes(cluster) if n.is_head == head)
        lab(number, "power-off", node.host.name)
        return node.host.name

    from django.conf import settings

    settings.VOLT_JOB_POLL_S = 1.0
    cluster, user = cluster_and_user(3)
    try:
        result = scenario(cluster, user, args, reference_run(cluster, user, args), head=False, fault=fault)
    finally:
        cluster.refresh_from_db()
        if cluster.status not in ("terminated", "failed"):
            services.terminate_cluster(cluster, wait=True)
    return {
        "powered_off": result["killed"],
        "detected_s": result["detected_s"],
        "ready_s": result["ready_s"],
        "resumed_s": result["resumed_s"],
        "steps_lost": result["steps_lost"],
        "params_match": result["final_params_match"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=int, default=90)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.4)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/lab.py makes network, mount and PID namespaces: run it as root (sudo)")
    with tempfile.TemporaryDirectory(prefix="volt-bench-lab-") as workdir:
        setup(Path(workdir))
        from django.conf import settings

        from inventory.lab import operations

        declared = Path(workdir) / "topology.json"
        declared.write_text(json.dumps(topology()))
        lab(args.lab, "up", "--topology", str(declared))
        try:
            status = operations.status(Path(settings.VOLT_LAB_DIR), args.lab)
            names = [m.name for m in status.machines]
            boot = bootstrap(status, names)
            print(f"bootstrap: one {boot['one_s']} s, 8 in parallel {boot['parallel_8_s']} s", flush=True)
            northwind = [name for name in names if name.startswith("nw-")][:4]
            hosts = onboard(
                status, northwind, operations.read_lab(Path(settings.VOLT_LAB_DIR), args.lab)[0].scale
            )
            readiness = ready(hosts, args.rounds)
            print(f"ready: Volt {readiness['volt_s']} s (+ probe {readiness['probe_s']} s), "
                  f"by hand {readiness['by_hand_s']} s", flush=True)  # fmt: skip
            off = power_off(args.lab, args)
        finally:
            lab(args.lab, "down")
            from inventory import tunnels

            tunnels.close_all()
    print_table([{"case": "bootstrap", **boot}, {"case": "ready", **readiness}, {"case": "power_off", **off}],
                ["case", "one_s", "parallel_8_s", "volt_s", "probe_s", "by_hand_s", "detected_s", "ready_s",
                 "resumed_s", "params_match"])  # fmt: skip
    emit_json({"bench": "lab", "machines": len(names), "bootstrap": boot, "ready": readiness,
               "power_off": off, "load_avg_1m": round(os.getloadavg()[0], 1)})  # fmt: skip


if __name__ == "__main__":
    main()
