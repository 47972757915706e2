"""Baseline for issue 14's bench/recovery.py: Ray Train's own restore after a worker node is SIGKILLed.

    flock /tmp/volt-ray.lock .venv/bin/python bench/ray_train_baseline.py [--steps 80] [--kill-at 23]

The same workload as Volt's demo (jobs/workloads/demo_train.py: its model, data from (seed, step, rank),
Adam) as a Ray Train `TorchTrainer` (gloo, 2 workers, STRICT_SPREAD: one per node) with
`FailureConfig(max_failures=3)` and a checkpoint every `--checkpoint-every` steps (rank 0 saves model,
optimizer and step; `ray.train.get_checkpoint()` restores them), submitted as a Ray job to a plain local
2-node Ray cluster (bench/plain_ray.py: `ray start` by hand, no Volt). When the job's log shows step
`--kill-at`, every process of the worker node (not the head) is SIGKILLed by PID, and a replacement node
is started by hand at once on a fresh address. Ray Train notices, waits for resources, restarts its
worker group from the latest checkpoint it has.

Measured: `resumed_s` = kill → the first training step completed after the restore (the workload's own
timestamp), `steps_lost` = the last step logged before the kill - the step restored from.
`run_baseline()` returns {"resumed_s", "steps_lost", ...}; `__main__` prints it as the last line (JSON).
Needs `ray[train]` (pandas, pyarrow): the project's dev extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "jobs" / "workloads"
TIMEOUT_S = 400.0


# ------------------------------------------------------------------- the job (runs on the cluster)


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker: the demo's model and data, checkpoints through Ray Train."""
    import demo_train
    import ray.train
    import torch
    import volt_ckpt
    from ray.train.torch import prepare_model

    torch.set_num_threads(1)
    cfg = demo_train.TrainConfig(seed=config["seed"], steps=config["steps"])
    context = ray.train.get_context()
    rank = context.get_world_rank()
    model = demo_train.make_model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step = 0
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        if rank == 0:
            volt_ckpt.emit_resumed(step, restored.path)
    model = prepare_model(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    while step < cfg.steps:
        step += 1
        inputs, labels = demo_train.make_batch(cfg, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if rank == 0:
            volt_ckpt.emit_step(step, loss.item())
        if step % config["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                checkpoint = None
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": step}, os.path.join(folder, "state.pt"))  # fmt: skip
                    checkpoint = ray.train.Checkpoint.from_directory(folder)
                ray.train.report({"step": step}, checkpoint=checkpoint)
            if rank == 0:
                volt_ckpt.emit("checkpoint", step=step, path="ray-train")
        time.sleep(config["step_sleep"])


def job_main(argv: list[str]) -> int:
    """Entrypoint inside the Ray job: fit the TorchTrainer with FailureConfig."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--step-sleep", type=float, required=True)
    parser.add_argument("--storage", required=True)
    args = parser.parse_args(argv)
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address="auto")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "seed": 0,
            "steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "step_sleep": args.step_sleep,
        },  # fmt: skip
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}, placement_strategy="STRICT_SPREAD"
        ),  # fmt: skip
        run_config=RunConfig(
            name="baseline",
            storage_path=args.storage,
            failure_config=FailureConfig(max_failures=3),
            checkpoint_config=CheckpointConfig(num_to_keep=3),
        ),  # fmt: skip
    )
    result = trainer.fit()
    print(f"ray_train_baseline: fit ended, error={result.error!r}", flush=True)
    return 0 if result.error is None else 1


# --------------------------------------------------------------------------- the bench (this side)


def run_baseline(
    steps: int = 80,
    checkpoint_every: int = 10,
    kill_at: int = 23,
    step_sleep: float = 0.2,
    subnet: str | None = None,
    first_slot: int | None = None,
) -> dict[str, Any]:
    """Run the baseline once on its own plain 2-node cluster; {"resumed_s", "steps_lost", ...}."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(WORKLOADS))
    import volt_ckpt
    from ray.job_submission import JobSubmissionClient

    from bench.plain_ray import PlainRayCluster

    subnet = subnet or f"127.0.{200 + os.getpid() % 40}"
    first_slot = first_slot if first_slot is not None else 90 + os.getpid() % 5
    workdir = Path(tempfile.mkdtemp(prefix="volt-raytrain-"))
    job_dir = workdir / "job"
    job_dir.mkdir()
    for name in ("demo_train.py", "volt_ckpt.py"):
        shutil.copy(WORKLOADS / name, job_dir / name)
    shutil.copy(Path(__file__), job_dir / "ray_train_baseline.py")
    cluster = PlainRayCluster([f"{subnet}.2", f"{subnet}.3"], first_slot=first_slot, workdir=str(workdir))
    try:
        cluster.start(timeout_s=180)
        client = JobSubmissionClient(cluster.dashboard_url)
        job_id = client.submit_job(
            entrypoint=f"python ray_train_baseline.py --in-job --steps {steps} --checkpoint-every "
            f"{checkpoint_every} --step-sleep {step_sleep} --storage {workdir / 'storage'}",
            runtime_env={"working_dir": str(job_dir), "env_vars": {"GLOO_SOCKET_IFNAME": "lo"}},
        )
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # until the log shows step kill_at
            events = volt_ckpt.parse_events(client.get_job_logs(job_id))
            if any(e["kind"] == "step" and e["step"] >= kill_at for e in events):
                break
            if client.get_job_status(job_id).is_terminal() or time.monotonic() > deadline:
                raise RuntimeError(
                    "the job never reached the kill step:\n" + client.get_job_logs(job_id)[-3000:]
                )
            time.sleep(0.1)
        victim = cluster.nodes[1]
        killed_at = time.time()
        cluster.kill_node(victim, signal.SIGKILL)
        cluster.add_worker(f"{subnet}.4")  # the replacement, started by hand at once
        while not client.get_job_status(job_id).is_terminal():
            if time.monotonic() > deadline:
                client.stop_job(job_id)
                raise RuntimeError("the job did not finish:\n" + client.get_job_logs(job_id)[-3000:])
            time.sleep(0.5)
        status = str(client.get_job_status(job_id).value)
        logs = client.get_job_logs(job_id)
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return summarize(volt_ckpt.parse_events(logs), killed_at, status, logs)


def summarize(events: list[dict], killed_at: float, status: str, logs: str) -> dict[str, Any]:
    """resumed_s and steps_lost from the job's events and the kill time."""
    before = [e["step"] for e in events if e["kind"] == "step" and e["time"] <= killed_at]
    resumed = [e for e in events if e["kind"] == "resumed"]
    after = [e for e in events if e["kind"] == "step" and e["time"] > killed_at]
    if not resumed or not after:
        raise RuntimeError(f"Ray Train did not resume (job {status}):\n{logs[-4000:]}")
    restored_step = resumed[-1]["step"]
    first_after = next(e for e in after if e["step"] > restored_step)
    return {
        "resumed_s": round(first_after["time"] - killed_at, 2),
        "steps_lost": max(before) - restored_step,
        "last_step_before_kill": max(before),
        "restored_step": restored_step,
        "job_status": status,
        "final_step": max(e["step"] for e in events if e["kind"] == "step"),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--in-job" in argv:
        return job_main([a for a in argv if a != "--in-job"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=23, help="SIGKILL the worker node at this step")
    parser.add_argument("--step-sleep", type=float, default=0.2)
    args = parser.parse_args(argv)
    result = run_baseline(args.steps, args.checkpoint_every, args.kill_at, args.step_sleep)
    print(f"Ray Train restore: kill → resumed {result['resumed_s']:.1f} s, {result['steps_lost']} steps lost "
          f"(last step {result['last_step_before_kill']}, restored {result['restored_step']})", flush=True)  # fmt: skip
    print(json.dumps({"bench": "ray_train_baseline", **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
