"""The demo workload for real, as a Ray job on a plain 2-node local Ray cluster (no Volt).

Run under `flock /tmp/volt-ray.lock` (one helper's Ray clusters at a time on this machine).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.plain_ray import PlainRayCluster
from jobs.workloads import volt_ckpt

pytestmark = pytest.mark.integration

WORKLOADS = Path(volt_ckpt.__file__).resolve().parent
# Addresses and port slots of this test's own nodes (bench/plain_ray.py: slot s = ports 26000 + 50 s).
IPS = [f"127.0.0.{200 + os.getpid() % 20 * 2 + i}" for i in range(2)]
FIRST_SLOT = 40 + os.getpid() % 20


def run_job(
    cluster: PlainRayCluster, entrypoint: str, env: dict[str, str], timeout_s: float = 300
) -> tuple[str, str]:
    """Submit through the head's job API, wait for the end; (status, logs)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    job_id = client.submit_job(
        entrypoint=entrypoint,
        runtime_env={"working_dir": str(WORKLOADS), "excludes": ["__pycache__"],
                     "env_vars": {"GLOO_SOCKET_IFNAME": "lo", **env}},
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not client.get_job_status(job_id).is_terminal():
        assert time.monotonic() < deadline, client.get_job_logs(job_id)[-3000:]
        time.sleep(0.5)
    return str(client.get_job_status(job_id).value), client.get_job_logs(job_id)


@pytest.fixture(scope="module")
def cluster():
    with PlainRayCluster(IPS, first_slot=FIRST_SLOT) as plain:
        plain.start(timeout_s=180)
        yield plain


def test_demo_runs_as_a_ray_job_one_rank_per_node(cluster: PlainRayCluster, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    status, logs = run_job(
        cluster,
        "python demo_train.py --steps 30 --seed 0 --step-sleep 0.02",
        {"VOLT_CHECKPOINT_DIR": str(checkpoints), "VOLT_CHECKPOINT_EVERY": "10", "VOLT_NUM_NODES": "2",
         "VOLT_JOB_ID": "test"},
    )  # fmt: skip
    assert status == "SUCCEEDED", logs[-4000:]
    events = volt_ckpt.parse_events(logs)
    steps = [e for e in events if e["kind"] == "step"]
    assert steps[0]["step"] == 1 and steps[-1]["step"] == 30
    busbw = [e for e in events if e["kind"] == "busbw"]
    assert len(busbw) == 6 and all(e["world_size"] == 2 and e["busbw_gbps"] > 0 for e in busbw)
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [10, 20, 30]
    assert [(c["step"], c["synchronized"], c["world_size"]) for c in volt_ckpt.scan(checkpoints)] == [
        (10, True, 2), (20, True, 2), (30, True, 2),
    ]  # fmt: skip
    ranks_line = next(line for line in logs.splitlines() if line.startswith("demo_train: ranks on"))
    assert sorted(part.split("=")[1] for part in ranks_line.split(": ", 1)[1].split(", ")) == sorted(IPS)
    done = events[-1]
    assert done["kind"] == "done" and done["step"] == 30

    # Resumed on the cluster from step 20: the same final parameters, bitwise.
    status, logs = run_job(
        cluster,
        "python demo_train.py --steps 30 --seed 0 --checkpoint-every 10",
        {
            "VOLT_CHECKPOINT_DIR": str(tmp_path / "again"),
            "VOLT_RESUME_FROM": str(checkpoints / "step-00000020"),
        },
    )
    assert status == "SUCCEEDED", logs[-4000:]
    events = volt_ckpt.parse_events(logs)
    assert events[0] == {"kind": "resumed", "step": 20, "path": str(checkpoints / "step-00000020")}
    assert events[-1] == done


def test_a_rank_that_fails_fails_the_job(cluster: PlainRayCluster) -> None:
    status, logs = run_job(cluster, "python demo_train.py --steps 30 --fail-at-step 4 --fail-rank 1", {})
    assert status == "FAILED", logs[-4000:]
    assert "a rank failed" in logs
    assert not [e for e in volt_ckpt.parse_events(logs) if e["kind"] == "done"]
