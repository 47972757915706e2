"""The demo workload without Ray: 2 ranks as local processes (gloo over 127.0.0.1).

Deterministic given the seed, and a run resumed from a synchronized checkpoint ends bitwise equal
to the uninterrupted run (same params_sha256).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from jobs.workloads import demo_train, volt_ckpt


def run(capfd, **options) -> tuple[int, list[dict], list[dict], str]:
    """(exit code, per-rank results, rank 0's events, stderr) of a 2-rank local run."""
    config = demo_train.TrainConfig(**{"steps": 8, "seed": 3, "log_every": 2, "busbw_every": 2, **options})
    code, results = demo_train.run_local(config, world=2, timeout_s=300)
    captured = capfd.readouterr()
    return code, results, volt_ckpt.parse_events(captured.out), captured.err


def test_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(tmp_path: Path, capfd) -> None:
    straight_dir, first_dir = tmp_path / "straight", tmp_path / "first"
    code, straight, events, _ = run(capfd, checkpoint_every=4, checkpoint_dir=str(straight_dir))
    assert code == 0
    assert straight[0]["params_sha256"] == straight[1]["params_sha256"]  # DDP replicas agree
    assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2, 4, 6, 8]  # the first step early
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [4, 8]
    busbw = [e for e in events if e["kind"] == "busbw"]
    assert busbw and all(e["world_size"] == 2 and e["bytes"] > 0 and e["busbw_gbps"] > 0 for e in busbw)
    assert events[-1] == {"kind": "done", "step": 8, "params_sha256": straight[0]["params_sha256"]}
    assert [(e["step"], e["synchronized"]) for e in volt_ckpt.scan(straight_dir)] == [(4, True), (8, True)]
    # Each checkpoint event says what it saved (the log shows "checkpoint step 4 saved (2 shards, ...)").
    saved = [(e["shards"], e["bytes"]) for e in events if e["kind"] == "checkpoint"]
    assert saved == [(2, c["bytes"]) for c in volt_ckpt.scan(straight_dir)]

    # k = 4 steps, stopped; then a new run resumes from its step-4 checkpoint and goes on to 8.
    code, first, _, _ = run(capfd, steps=4, checkpoint_every=4, checkpoint_dir=str(first_dir))
    assert code == 0
    resume = volt_ckpt.latest_synchronized(first_dir)
    assert resume["step"] == 4
    code, resumed, events, _ = run(
        capfd, checkpoint_every=4, checkpoint_dir=str(first_dir), resume_from=resume["path"]
    )
    assert code == 0
    assert events[0] == {"kind": "resumed", "step": 4, "path": resume["path"]}
    assert [e["step"] for e in events if e["kind"] == "step"] == [5, 6, 8]
    assert resumed[0]["params_sha256"] == straight[0]["params_sha256"]
    assert first[0]["params_sha256"] != straight[0]["params_sha256"]  # the hash does see training


def test_resume_refuses_a_checkpoint_that_is_not_synchronized(tmp_path: Path, capfd) -> None:
    code, _, _, _ = run(capfd, steps=2, checkpoint_every=2, checkpoint_dir=str(tmp_path / "a"))
    assert code == 0
    partial = tmp_path / "partial" / "step-00000002"
    shutil.copytree(tmp_path / "a" / "step-00000002", partial)
    (partial / "manifest.json").unlink()
    code, results, events, err = run(capfd, steps=4, resume_from=str(partial))
    assert code != 0
    assert results == [] and not [e for e in events if e["kind"] == "done"]
    assert "not a synchronized checkpoint: no manifest" in err


def test_a_failed_rank_fails_the_run(capfd) -> None:
    code, _, events, err = run(capfd, steps=8, fail_at_step=3, fail_rank=1)
    assert code != 0
    assert not [e for e in events if e["kind"] == "done"]
    assert "rank 1 fails at step 3" in err
