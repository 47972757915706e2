"""Realtime: cluster events from a Celery task to 100 / 500 / 1,000 websocket subscribers, and sweep cost.

    REDIS_URL=redis://127.0.0.1:6379/<db> .venv/bin/python bench/realtime.py \
        [--subscribers 100,500,1000] [--seconds 20] [--clusters 10,50]

Delivery: a temporary SQLite database with one READY cluster and its team's API token; daphne
(voltweb.asgi, channels-redis on REDIS_URL) and a Celery worker (solo, with bench/realtime_tasks.py) as
subprocesses. For each subscriber count, that many websockets connect to /ws/clusters/<id>/?token=...
(aiohttp clients in this process), then a Celery task broadcasts one event a second for `--seconds`
(realtime.broadcast, the production path). Latency = receive time - the task's send stamp (one machine,
one clock). The web process's CPU is psutil's cpu_percent over the publishing window (100 = one core).

Sweep: `--clusters` READY clusters of two nodes each on 10 local hosts registered without Ray (real
onboarding through the simulated nvidia-smi; heads at a closed port, so the head check answers at once).
Each cluster is swept twice by watch.sweep_cluster (the task's body) in this process; the second round
is measured: CPU of this process plus its children (the local driver's shells) per cluster-sweep.
The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import emit_json, percentile, print_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONNECT_TIMEOUT_S = 120
CONNECT_BATCH = 50


def setup(workdir: Path) -> dict:
    env = {
        "DJANGO_SETTINGS_MODULE": "voltweb.settings",
        "VOLT_DATA_DIR": str(workdir),
        "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
        "VOLT_AUTO_PROVISION": "0",
        "VOLT_ALLOW_LOCAL_HOSTS": "1",  # the sweep part registers local hosts (no Ray)
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DEBUG": "1",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def make_cluster(name: str = "bench") -> tuple[int, str]:
    from django.contrib.auth import get_user_model

    from clusters.choices import ClusterStatus
    from clusters.models import Cluster
    from voltweb import services as accounts
    from voltweb.choices import TeamRole

    team = accounts.create_team("Bench lab", "bench-lab")
    user = get_user_model().objects.create_user("bench", password="bench-pw")
    accounts.add_member(team, user, TeamRole.RESEARCHER)
    cluster = Cluster.objects.create(team=team, name=name, spec={}, status=ClusterStatus.READY)
    return cluster.pk, accounts.create_api_token(user, "bench").secret


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_servers(env: dict, workdir: Path, port: int) -> dict[str, subprocess.Popen]:
    full = {**os.environ, **env, "PYTHONPATH": f"{REPO / 'bench'}:{REPO}", "PYTHONUNBUFFERED": "1"}
    python = sys.executable
    commands = {
        "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
        "worker": [python, "-m", "celery", "-A", "voltweb", "worker", "-Q", "monitoring", "-P", "solo",
                   "-n", f"volt-bench-{os.getpid()}@%h", "--include", "realtime_tasks",
                   "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"],
    }  # fmt: skip
    processes = {}
    for name, command in commands.items():
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        processes[name] = subprocess.Popen(
            command, cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return processes


def stop(processes: dict[str, subprocess.Popen]) -> None:
    for proc in processes.values():
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
    for proc in processes.values():
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


async def wait_web(port: int) -> None:
    import aiohttp

    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError("daphne did not answer /healthz within 60 s")


async def run_level(port: int, cluster_id: int, token: str, subscribers: int, seconds: int, web) -> dict:
    import aiohttp

    from voltweb.celery import app

    latencies: list[float] = []
    received = 0
    url = f"ws://127.0.0.1:{port}/ws/clusters/{cluster_id}/?token={token}"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def subscriber(connected: asyncio.Future):
            nonlocal received
            try:
                async with session.ws_connect(url, origin=f"http://127.0.0.1:{port}", max_msg_size=0) as ws:
                    first = await ws.receive_json(timeout=CONNECT_TIMEOUT_S)
                    connected.set_result(first.get("kind") == "snapshot")
                    async for message in ws:
                        event = message.json()
                        if event.get("kind") == "bench":
                            latencies.append((time.time() - event["sent"]) * 1000)
                            received += 1
            except (aiohttp.ClientError, TimeoutError, OSError):
                if not connected.done():
                    connected.set_result(False)

        # Connect in batches (a burst of hundreds overflows the listen backlog); each batch waits for its
        # snapshots. A client that cannot connect is counted, not retried.
        started = time.monotonic()
        clients, ok = [], 0
        loop = asyncio.get_running_loop()
        for first in range(0, subscribers, CONNECT_BATCH):
            batch = [loop.create_future() for _ in range(min(CONNECT_BATCH, subscribers - first))]
            clients += [asyncio.create_task(subscriber(f)) for f in batch]
            ok += sum(await asyncio.wait_for(asyncio.gather(*batch), CONNECT_TIMEOUT_S))
        connect_s = time.monotonic() - started
        web.cpu_percent(None)
        for seq in range(seconds):
            app.send_task("bench.emit_cluster_event", args=[cluster_id, seq], queue="monitoring")
            await asyncio.sleep(1.0)
        await asyncio.sleep(2.0)  # the last events drain
        cpu = web.cpu_percent(None)
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    sent = seconds * ok  # events owed to the subscribers that connected
    return {
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "received": received,
        "sent": sent,
        "connected": ok,
        "connect_s": round(connect_s, 1),
        "web_cpu_pct": round(cpu, 1),
    }


def sweep_cost(cluster_counts: list[int], hosts: int = 10) -> dict:
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from clusters.choices import ClusterStatus
    from clusters.models import Cluster, ClusterNode
    from clusters.telemetry import watch
    from inventory import services
    from inventory.choices import DriverKind, FabricKind
    from voltweb.models import Team

    admin = get_user_model().objects.create_user("bench-provider")
    provider = services.review_provider(
        services.register_provider(admin, "BenchCo", "ops@bench.example"), True
    )
    fabric = services.create_fabric(
        provider, services.get_or_create_site("b1", "bench"), "b1-ib", FabricKind.IB_NDR, 400.0, 1.0, ["r1"]
    )
    host_rows = []
    for i in range(hosts):
        request = services.HostRequest(
            name=f"sweep{i}", block=fabric.blocks.first(), driver=DriverKind.LOCAL,
            price_per_gpu_hour=Decimal("1"), local_spec=services.default_local_spec("H100", 8, fabric.kind),
        )  # fmt: skip
        host_rows.append(services.onboard_host(services.add_host(provider, request, queue=False).pk))
    team = Team.objects.get(slug="bench-lab")
    results = {}
    made = 0
    for count in cluster_counts:
        while made < count:
            cluster = Cluster.objects.create(team=team, name=f"sweep-{made}", spec={}, status=ClusterStatus.READY,
                                             dashboard_url="http://127.0.0.1:1")  # fmt: skip
            for rank in range(2):
                ClusterNode.objects.create(cluster=cluster, host=host_rows[(made * 2 + rank) % hosts], rank=rank,
                                           is_head=rank == 0, gpu_indices=[made % 8])  # fmt: skip
            made += 1
        ids = list(Cluster.objects.filter(name__startswith="sweep-").values_list("pk", flat=True))
        for cluster_id in ids:  # warm-up round: first verdicts, READY -> DEGRADED
            watch.sweep_cluster(cluster_id)
        cpu0, children0, wall0 = time.process_time(), _children_cpu(), time.monotonic()
        for cluster_id in ids:
            watch.sweep_cluster(cluster_id)
        cpu = (time.process_time() - cpu0) + (_children_cpu() - children0)
        wall = time.monotonic() - wall0
        results[str(count)] = {
            "cpu_ms_per_cluster_sweep": round(cpu / len(ids) * 1000, 1),
            "wall_ms_per_cluster_sweep": round(wall / len(ids) * 1000, 1),
            "cpu_s_per_round": round(cpu, 2),
            "worker_cores_at_5s_interval": round(cpu / 5.0, 2),
        }
    return results


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", default="100,500,1000")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clusters", default="10,50")
    args = parser.parse_args()
    levels = [int(n) for n in args.subscribers.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="volt-bench-rt-") as tmp:
        workdir = Path(tmp)
        env = setup(workdir)
        cluster_id, token = make_cluster()
        port = free_port()
        processes = start_servers(env, workdir, port)
        delivery = {}
        try:
            asyncio.run(wait_web(port))
            web = psutil.Process(processes["web"].pid)
            for level in levels:
                delivery[str(level)] = asyncio.run(
                    run_level(port, cluster_id, token, level, args.seconds, web)
                )
                print(f"{level} subscribers: {delivery[str(level)]}", flush=True)
        finally:
            stop(processes)
        sweep = sweep_cost([int(n) for n in args.clusters.split(",") if n])
    rows = [{"subscribers": k, **v} for k, v in delivery.items()]
    print_table(
        rows, ["subscribers", "connected", "p50_ms", "p99_ms", "received", "sent", "connect_s", "web_cpu_pct"]
    )
    print_table([{"clusters": k, **v} for k, v in sweep.items()],
                ["clusters", "cpu_ms_per_cluster_sweep", "wall_ms_per_cluster_sweep", "worker_cores_at_5s_interval"])  # fmt: skip
    peak_cpu = max((v["web_cpu_pct"] for v in delivery.values()), default=None)
    emit_json({
        "bench": "realtime",
        "seconds": args.seconds,
        "subscribers": {k: {m: v[m] for m in ("p50_ms", "p99_ms", "received", "sent", "connected")} for k, v in delivery.items()},
        "web_cpu_pct": peak_cpu,
        "web_cpu_pct_by_level": {k: v["web_cpu_pct"] for k, v in delivery.items()},
        "sweep": sweep,
    })  # fmt: skip


if __name__ == "__main__":
    main()
