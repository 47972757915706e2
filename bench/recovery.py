"""Recovery: fault → detected → replacement ready → job resumed, and steps lost, for worker and head loss.

    .venv/bin/python bench/recovery.py [--steps 60] [--checkpoint-every 10] [--step-sleep 0.4]

Sets up its own SQLite database and six local hosts (real onboarding) in a temporary folder, requests a
3-node cluster and provisions it as the Celery task does, then:

- reference: the demo workload (jobs/workloads/demo_train.py, seed 0) runs uninterrupted; its final
  params_sha256 is the reference;
- worker loss: the demo again; once it passed two checkpoints a worker node's Ray processes are
  SIGKILLed. This process then plays the worker and beat: a watch sweep every VOLT_WATCH_INTERVAL_S (5 s
  by default, as beat runs it), the recovery task body once the cluster is DEGRADED, the job's start and
  poll task bodies every VOLT_JOB_POLL_S. Measured from the kill: detected_s (cluster DEGRADED),
  replacement_ready_s (the replacement's Ray node joined), resumed_s (the resubmitted job logged its
  first step after the checkpoint), steps_lost, final_params_match;
- head loss: the same with the head's processes SIGKILLed (the cluster is re-formed around a new head).

The Ray Train baseline (TorchTrainer with FailureConfig, a replacement node started by hand) is the ckpt
helper's bench/ray_train_baseline.py: run when present, else reported as missing. The last line is JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench._common import emit_json, print_table  # noqa: E402


def setup(workdir: Path, hosts: int) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "voltweb.settings",
            "DEBUG": "1",  # a dev run like the demo (DEBUG=0 wants a real SECRET_KEY since issue 9)
            "VOLT_ALLOW_LOCAL_HOSTS": "1",  # off by default since issue 9; the bench adds them as Volt
            "VOLT_DATA_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
            "VOLT_AUTO_PROVISION": "0",
            "VOLT_AUTO_RECOVER": "0",  # the bench calls the recovery task body itself
            "CELERY_BROKER_URL": "memory://",
            "VOLT_PROBE_MAX_MB": os.environ.get("VOLT_PROBE_MAX_MB", "8"),
            "VOLT_SLOW_HOST_REPLACEMENTS": "0",
            "VOLT_LOCAL_FABRIC_EMULATION": "off",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from bench.provisioning import seed_hosts

    seed_hosts(hosts)


def cluster_and_user(nodes: int):
    from django.contrib.auth import get_user_model

    from clusters import provision, services
    from voltweb.models import Team

    user = get_user_model().objects.get(username="bench-researcher")  # bench.provisioning.seed_hosts
    team = Team.objects.get(slug="bench")
    cluster = services.request_cluster(
        team, user, {"name": "bench", "nodes": nodes, "gpus_per_node": 2, "gpu_models": ["H100"]}
    )
    services.place_cluster(cluster.pk)
    cluster = provision.provision_cluster(cluster.pk)
    if cluster.status != "ready":
        raise SystemExit(f"cluster not ready: {cluster.failure_message}")
    return cluster, user


class Driver:
    """Plays Celery: the job's start and poll bodies, the watch sweep, the recovery task body."""

    def __init__(self, cluster):
        from django.conf import settings

        self.cluster = cluster
        self.watch_s = settings.VOLT_WATCH_INTERVAL_S
        self.poll_s = settings.VOLT_JOB_POLL_S
        self.next_sweep = 0.0

    def run_job(self, job, until, timeout_s: float = 900, fault_at=None):
        """Start (and restart after a resubmission) and poll `job` until `until(job)`; sweeps and recovers
        the cluster meanwhile. Returns the job and the times seen (monotonic)."""
        from clusters import recovery
        from clusters.models import Cluster
        from clusters.telemetry import watch
        from jobs import services as jobs
        from jobs.models import Job

        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = Job.objects.get(pk=job.pk)
            if job.status == "pending" and not job.ray_submission_id:
                jobs.start_job(job.pk)
            elif job.ray_submission_id and job.status in ("pending", "running", "interrupted"):
                jobs.poll_job(job.pk)
            job = Job.objects.get(pk=job.pk)
            if job.attempt > 1 and "resumed" not in seen and job.status == "running" and job.first_step_at:
                tail = jobs.read_log(job, offset=max(0, job.log_size - jobs.LOG_PAGE_MAX))["text"]
                events = tail.split("[volt: attempt")[-1]
                if '"kind": "step"' in events or '"kind":"step"' in events:
                    seen["resumed"] = time.monotonic()
            if until(job):
                return job, seen
            now = time.monotonic()
            if fault_at is not None and now >= self.next_sweep:
                self.next_sweep = now + self.watch_s
                status = watch.sweep_cluster(self.cluster.pk)
                if status == "degraded" and "detected" not in seen:
                    seen["detected"] = time.monotonic()
                    recovery.recover_cluster(self.cluster.pk)
                    seen["recovered"] = time.monotonic()
                    self.cluster = Cluster.objects.get(pk=self.cluster.pk)
            time.sleep(self.poll_s / 2)
        raise SystemExit(
            f"job {job.pk} did not get there within {timeout_s} s ({job.status}, {job.last_step})"
        )


def reference_run(cluster, user, args) -> str:
    """The demo uninterrupted on `cluster` (seed 0, no step sleep): its final params_sha256, the reference."""
    from jobs import services as jobs

    job = jobs.submit_job(cluster, user, jobs.demo_entrypoint(args.steps, args.checkpoint_every, 0, 0.0),
                          working_dir=jobs.WORKLOADS_DIR, checkpoint_every=args.checkpoint_every,
                          is_demo=True)  # fmt: skip
    job, _ = Driver(cluster).run_job(job, lambda j: j.status in ("succeeded", "failed", "stopped"))
    return job.result.get("params_sha256")


def kill(cluster, head: bool) -> str:
    from clusters.provision import active_nodes, ray_cluster_id
    from clusters.provisioning import ray_nodes
    from inventory import services as inventory

    node = next(n for n in active_nodes(cluster) if n.is_head == head)
    with inventory.driver_for(node.host) as driver:
        handle = ray_nodes.find_node(driver, ray_cluster_id(cluster))
    os.killpg(handle.pgid, signal.SIGKILL)
    return node.host.name


def scenario(cluster, user, args, reference: str, head: bool, fault=kill) -> dict:
    """The demo past two checkpoints, then `fault(cluster, head)` (default: SIGKILL of the node's Ray
    processes; bench/lab.py powers its machine off) and the timings to the job's end."""
    from clusters.models import Recovery
    from jobs import services as jobs

    driver = Driver(cluster)
    job = jobs.submit_job(cluster, user, jobs.demo_entrypoint(args.steps, args.checkpoint_every, 0, args.step_sleep),
                          working_dir=jobs.WORKLOADS_DIR, checkpoint_every=args.checkpoint_every, is_demo=True)  # fmt: skip
    job, _ = driver.run_job(job, lambda j: (j.last_step or 0) >= 2 * args.checkpoint_every + 5)
    before = Recovery.objects.filter(cluster=cluster).count()
    t0 = time.monotonic()
    wall0 = time.time()
    host = fault(cluster, head)
    driver.next_sweep = 0.0
    job, seen = driver.run_job(job, lambda j: j.status in ("succeeded", "failed", "stopped"), fault_at=t0)
    record = Recovery.objects.filter(cluster=cluster).order_by("pk")[before:].first()
    ready = (
        record.replacement_ready_at.timestamp() - wall0 if record and record.replacement_ready_at else None
    )
    entry = (record.jobs or [{}])[0] if record else {}
    return {
        "killed": host,
        "recovery": record.status if record else None,
        "detected_s": round(seen["detected"] - t0, 2) if "detected" in seen else None,
        "replacement_ready_s": round(ready, 2) if ready is not None else None,
        "ready_s": round(record.ready_at.timestamp() - wall0, 2) if record and record.ready_at else None,
        "resumed_s": round(seen["resumed"] - t0, 2) if "resumed" in seen else None,
        "checkpoint_step": entry.get("checkpoint_step"),
        "steps_lost": entry.get("steps_lost"),
        "final_params_match": job.status == "succeeded" and job.result.get("params_sha256") == reference,
        "job_status": job.status,
        # where the time went: each recovery phase's start, and the probe's own phases, seconds from the kill
        "phases_s": {
            phase["phase"]: round(_unix(phase["started"]) - wall0, 2)
            for phase in (record.phases if record else [])
        },
        "probe": _probe_figures(cluster),
    }


def _unix(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _probe_figures(cluster) -> dict:
    from clusters.models import Cluster

    result = Cluster.objects.get(pk=cluster.pk).probe_result or {}
    return {
        "wall_s": result.get("wall_s"),
        "phases_s": result.get("phases_s"),
        "hosts_phase": result.get("hosts_phase"),
    }


def baseline(args) -> dict:
    script = ROOT / "bench" / "ray_train_baseline.py"
    if not script.exists():
        return {
            "missing": "bench/ray_train_baseline.py (the ckpt helper's Ray Train baseline) is not on this branch"
        }
    if importlib.util.find_spec("ray") is None:
        return {"missing": "ray not importable"}
    command = [sys.executable, str(script), "--steps", str(args.steps), "--checkpoint-every",
               str(args.checkpoint_every), "--kill-at", str(2 * args.checkpoint_every + 5)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (out.stderr or out.stdout)[-500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.4)
    parser.add_argument("--skip-baseline", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="volt-bench-recovery-") as workdir:
        setup(Path(workdir), hosts=6)
        from clusters import services

        cluster, user = cluster_and_user(3)
        try:
            reference = reference_run(cluster, user, args)
            results = {
                "worker_loss": scenario(cluster, user, args, reference, head=False),
                "head_loss": scenario(cluster, user, args, reference, head=True),
            }
        finally:
            cluster.refresh_from_db()
            if cluster.status not in ("terminated", "failed"):
                services.terminate_cluster(cluster, wait=True)
    rows = [{"case": name, **values} for name, values in results.items()]
    print_table(rows, ["case", "killed", "detected_s", "replacement_ready_s", "ready_s", "resumed_s",
                       "checkpoint_step", "steps_lost", "final_params_match"])  # fmt: skip
    base = {"missing": "skipped"} if args.skip_baseline else baseline(args)
    emit_json({"bench": "recovery", **results, "ray_train_baseline": base,
               "settings": {"steps": args.steps, "checkpoint_every": args.checkpoint_every,
                            "step_sleep": args.step_sleep}})  # fmt: skip


if __name__ == "__main__":
    main()
