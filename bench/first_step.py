"""First training step: request → READY → job submitted → first step logged, Volt beside doing it by hand.

    REDIS_URL=redis://127.0.0.1:6379/<db> flock /tmp/volt-ray.lock .venv/bin/python bench/first_step.py \
        [--steps 30] [--repeats 1]

One run, a 2-node local cluster, the demo workload (jobs/workloads/demo_train.py, `--steps`, a checkpoint
every 10 steps, seed 0) both ways:

- Volt: a Volt stack of its own (temporary SQLite database, two local hosts on a 127.0.N.x subnet of the
  bench's, onboarded for real; daphne, a Celery worker on every queue and beat as subprocesses, Redis at
  REDIS_URL) driven only through the REST API with a researcher's token, as CI would: POST
  /api/v1/clusters/, poll until READY, POST /api/v1/jobs/ {"demo": true}, poll the job until
  `first_step_at` is set. Phases come from the records (cluster created/placed/verifying/ready, job
  created/submitted/first step). Volt's settings are its defaults (the verification probe included),
  except the fabric emulation: off, so both paths run on plain loopback.
- By hand: on the same two addresses, plain `ray start --block` of the head, then the worker (every
  port and temp dir given, bench/plain_ray.py), until both are ALIVE; then `ray job submit` of the same
  command with the same working dir, until its output shows the first step.

Both end at the workload's own timestamp of step 1 (its `VOLT_EVENT step` line), so the figure is
"the first training step happened", not when someone noticed. With --repeats N the paths alternate
which goes first; medians count. Targets (issue 13): Volt under 60 s and within 1.5x by hand.
The last line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json  # noqa: E402
from bench.plain_ray import PlainRayCluster  # noqa: E402

WORKLOADS = ROOT / "jobs" / "workloads"
SUBNET = f"127.0.{160 + os.getpid() % 40}"
TARGET_S = 60.0
TARGET_FACTOR = 1.5
PLAIN_SLOT = 70 + os.getpid() % 10
TIMEOUT_S = 300.0


# ------------------------------------------------------------------------------------- Volt stack


def setup(workdir: Path) -> dict[str, str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "voltweb.settings",
        "VOLT_DATA_DIR": str(workdir / "data"),
        "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
        "VOLT_AUTO_PROVISION": "1",
        "VOLT_ALLOW_LOCAL_HOSTS": "1",  # local hosts (sandboxes on this machine) are off by default
        "VOLT_LOCAL_FABRIC_EMULATION": "off",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DEBUG": "0",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on loopback (no TLS proxy in front)
        "SECRET_KEY": "first-step-bench-" + os.urandom(8).hex(),
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def seed(hosts: int) -> str:
    """Two approved local hosts and a researcher; returns the researcher's API token."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from inventory import services
    from voltweb import services as accounts

    owner = get_user_model().objects.create_user("bench-provider")
    provider = services.review_provider(services.register_provider(owner, "Bench Cloud"), approve=True)
    site = services.get_or_create_site("lab1", "bench-region")
    fabric = services.create_fabric(provider, site, "lab1-ib", "ib_ndr", 400.0, 1.0, ["r1"])
    for i in range(hosts):
        request = services.HostRequest(
            name=f"node-{i}",
            block=fabric.blocks.get(),
            driver="local",
            address=f"{SUBNET}.{i + 2}",
            price_per_gpu_hour=Decimal("2.00"),
            local_spec=services.default_local_spec("H100", 2, "ib_ndr"),
        )
        services.onboard_host(services.add_host(provider, request, queue=False).pk)
    researcher = get_user_model().objects.create_user("bench-researcher")
    accounts.add_member(accounts.create_team("Bench", "bench"), researcher)
    return accounts.create_api_token(researcher, "bench").secret


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_stack(env: dict[str, str], workdir: Path, port: int) -> dict[str, subprocess.Popen]:
    from django.conf import settings

    from voltweb.celery import app

    with app.connection_for_write() as conn:  # a task left in this Redis db by an earlier run must not run
        for queue in settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(queue)
    full = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    python = sys.executable
    commands = {
        "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "voltweb.asgi:application"],
        "worker": [python, "-m", "celery", "-A", "voltweb", "worker", "-Q", ",".join(settings.VOLT_QUEUES),
                   "-c", "2", "-n", f"first-step-{os.getpid()}@%h", "--loglevel", "WARNING"],
        "beat": [python, "-m", "celery", "-A", "voltweb", "beat", "--loglevel", "WARNING",
                 "-s", str(workdir / "celerybeat-schedule")],
    }  # fmt: skip
    processes = {}
    for name, command in commands.items():
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        processes[name] = subprocess.Popen(
            command, cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return processes


def stop_stack(processes: dict[str, subprocess.Popen]) -> None:
    for process in processes.values():
        try:
            os.killpg(process.pid, 15)
        except ProcessLookupError:
            pass
    for process in processes.values():
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)


class Api:
    """The REST API with a bearer token (stdlib HTTP, as any CI script could)."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base.rstrip("/"), token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def wait(self, path: str, done, what: str, timeout_s: float = TIMEOUT_S, poll_s: float = 0.2) -> dict:
        deadline = time.monotonic() + timeout_s
        body: dict = {}
        while time.monotonic() < deadline:
            status, body = self.call("GET", path)
            if status == 200 and done(body):
                return body
            time.sleep(poll_s)
        raise SystemExit(f"{what}: not within {timeout_s:.0f} s; last answer {json.dumps(body)[:2000]}")


def wait_web(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("the web server did not answer /healthz within 60 s")


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def volt_run(api: Api, steps: int, index: int) -> dict:
    """Request → READY → job → first step through the API; seconds per phase from Volt's records."""
    requested = time.time()
    status, cluster = api.call("POST", "/api/v1/clusters/", {"name": f"first-step-{index}", "nodes": 2,
                                                             "gpus_per_node": 2, "gpu_models": ["H100"]})  # fmt: skip
    if status != 202 and status != 201:
        raise SystemExit(f"cluster request answered {status}: {cluster}")
    cid = cluster["id"]

    def ready(body: dict) -> bool:
        if body["status"] in ("failed", "terminated"):
            raise SystemExit(f"cluster {cid} ended {body['status']}: {body.get('failure_message')}")
        return body["status"] == "ready"

    cluster = api.wait(f"/api/v1/clusters/{cid}/", ready, "cluster READY")
    ready_seen = time.time()
    status, job = api.call("POST", "/api/v1/jobs/", {"cluster": cid, "demo": True, "steps": steps,
                                                     "checkpoint_every": 10, "seed": 0})  # fmt: skip
    if status != 202:
        raise SystemExit(f"job submission answered {status}: {job}")
    accepted = time.time()

    def stepped(body: dict) -> bool:
        if body["status"] in ("failed", "stopped"):
            raise SystemExit(f"job {body['id']} ended {body['status']}: {body['status_reason']}")
        return bool(body["first_step_at"])

    job = api.wait(f"/api/v1/jobs/{job['id']}/", stepped, "the job's first step")
    step_seen = time.time()
    job = api.wait(
        f"/api/v1/jobs/{job['id']}/", lambda b: b["status"] in ("succeeded", "failed"), "the job's end"
    )
    events = api.call("GET", f"/api/v1/clusters/{cid}/events/?page_size=100")[1].get("results", [])
    entered = {}
    for event in events:
        entered.setdefault(event["to_status"], _ts(event["at"]))
    api.call("POST", f"/api/v1/clusters/{cid}/terminate/")
    api.wait(f"/api/v1/clusters/{cid}/", lambda b: b["status"] == "terminated", "cluster terminated", 120)
    first_step = _ts(job["first_step_at"])
    marks = {  # seconds after the request
        "placed": entered.get("provisioning"),
        "verifying": entered.get("verifying"),
        "ready": _ts(cluster["ready_at"]),
        "ready_seen_by_client": ready_seen,
        "job_accepted": accepted,
        "job_submitted_to_ray": _ts(job["submitted_at"]),
        "job_running": _ts(job["started_at"]),
        "first_step": first_step,
        "first_step_seen_by_client": step_seen,
    }
    return {
        "seconds": round(first_step - requested, 2),
        "marks_s": {name: round(at - requested, 2) for name, at in marks.items() if at},
        "job_status": job["status"],
        "probe_busbw_gbps": cluster.get("measured_busbw_gbps"),
    }


# ---------------------------------------------------------------------------------------- by hand


def by_hand_run(steps: int, workdir: Path, index: int) -> dict:
    """Plain `ray start` on the same addresses, then `ray job submit`, until the first step line."""
    ips = [f"{SUBNET}.2", f"{SUBNET}.3"]
    started = time.time()
    cluster = PlainRayCluster(ips, first_slot=PLAIN_SLOT, workdir=str(workdir))
    try:
        cluster.start(timeout_s=TIMEOUT_S)
        alive = time.time()
        runtime_env = {"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "VOLT_NUM_NODES": "2",
                                    "VOLT_CHECKPOINT_DIR": str(workdir / f"by-hand-{index}")},
                       "excludes": ["__pycache__"]}  # fmt: skip
        command = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", cluster.dashboard_url,
                   "--working-dir", str(WORKLOADS), "--runtime-env-json", json.dumps(runtime_env), "--",
                   "python", "demo_train.py", "--steps", str(steps), "--checkpoint-every", "10", "--seed", "0"]  # fmt: skip
        submitted = time.time()
        first_step = _first_step_of(command)
        return {
            "seconds": round(first_step - started, 2),
            "marks_s": {
                "nodes_alive": round(alive - started, 2),
                "job_submitted": round(submitted - started, 2),
                "first_step": round(first_step - started, 2),
            },  # fmt: skip
        }
    finally:
        cluster.stop()


def _first_step_of(command: list[str]) -> float:
    """Run `ray job submit` (it tails the job's logs) until it ends; the first step event's time."""
    sys.path.insert(0, str(WORKLOADS))
    import volt_ckpt

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    first: float | None = None
    tail: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    assert process.stdout is not None
    for line in process.stdout:
        tail = (tail + [line])[-30:]
        event = volt_ckpt.parse_event(line)
        if first is None and event and event["kind"] == "step":
            first = float(event["time"])
        if time.monotonic() > deadline:
            process.kill()
            break
    code = process.wait(timeout=60)
    if first is None or code != 0:
        raise SystemExit(f"`ray job submit` exited {code} (first step {first}):\n{''.join(tail)}")
    return first


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1, help="rounds (medians; the paths alternate order)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="volt-bench-first-") as tmp:
        workdir = Path(tmp)
        env = setup(workdir)
        token = seed(2)
        port = free_port()
        processes = start_stack(env, workdir, port)
        volts, hands = [], []
        try:
            wait_web(port)
            api = Api(f"http://127.0.0.1:{port}", token)
            for index in range(args.repeats):
                order = ("volt", "by_hand") if index % 2 == 0 else ("by_hand", "volt")
                for path in order:
                    if path == "volt":
                        volts.append(volt_run(api, args.steps, index))
                        print(
                            f"round {index + 1}: Volt {volts[-1]['seconds']:.1f} s  {volts[-1]['marks_s']}",
                            flush=True,
                        )
                    else:
                        hands.append(by_hand_run(args.steps, workdir, index))
                        print(
                            f"round {index + 1}: by hand {hands[-1]['seconds']:.1f} s  {hands[-1]['marks_s']}",
                            flush=True,
                        )
        except BaseException:
            for name in ("worker", "web"):
                log = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                print(f"--- {name} log (tail) ---\n{log}", file=sys.stderr)
            raise
        finally:
            stop_stack(processes)
            shutil.rmtree(workdir / "data", ignore_errors=True)
    volt_s = statistics.median(v["seconds"] for v in volts)
    by_hand_s = statistics.median(h["seconds"] for h in hands)
    phases = _phases(volts[len(volts) // 2]["marks_s"])
    print(f"Volt request → first step {volt_s:.1f} s | by hand {by_hand_s:.1f} s | "
          f"{volt_s / by_hand_s:.2f}x | targets: < {TARGET_S:.0f} s and ≤ {TARGET_FACTOR}x", flush=True)  # fmt: skip
    emit_json({
        "bench": "first_step",
        "nodes": 2,
        "steps": args.steps,
        "repeats": args.repeats,
        "volt_s": volt_s,
        "by_hand_s": by_hand_s,
        "ratio": round(volt_s / by_hand_s, 2),
        "met": volt_s < TARGET_S and volt_s <= TARGET_FACTOR * by_hand_s,
        "phases": phases,
        "by_hand_phases": _phases(hands[len(hands) // 2]["marks_s"]),
        "volt_runs_s": [v["seconds"] for v in volts],
        "by_hand_runs_s": [h["seconds"] for h in hands],
        "load_avg_1m": round(os.getloadavg()[0], 1),
    })  # fmt: skip


def _phases(marks: dict[str, float]) -> dict[str, float]:
    """Durations between consecutive marks ("request→placed", ...), in the order they happened."""
    phases, previous, last = {}, "request", 0.0
    for name, at in sorted(marks.items(), key=lambda item: item[1]):
        phases[f"{previous}→{name}"] = round(at - last, 2)
        previous, last = name, at
    return phases


if __name__ == "__main__":
    main()
