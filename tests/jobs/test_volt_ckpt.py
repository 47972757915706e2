"""The checkpoint protocol on files written by the real helper (2 gloo ranks on 127.0.0.1), then damaged.

A checkpoint is synchronized only when its manifest (written last by rank 0) and every shard it lists
are present and match; anything else is recorded with a reason and never offered for resume.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.workloads import volt_ckpt

from .ckpt_workers import run_save

SHARD0 = "shard-00000-of-00002.pt"
SHARD1 = "shard-00001-of-00002.pt"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """Two synchronized checkpoints (steps 10 and 20) saved by two real ranks over gloo."""
    root = tmp_path_factory.mktemp("written")
    for step in (10, 20):
        reported = run_save(str(root), step)
        assert reported[0][0] == "ok" and reported[1][0] == "ok", reported
    return root


@pytest.fixture
def root(written: Path, tmp_path: Path) -> Path:
    """A private copy of the written checkpoints, for a test to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(written, copy)
    return copy


def entry(root: Path, step: int) -> dict:
    return next(e for e in volt_ckpt.scan(root) if e["step"] == step)


def test_every_rank_writes_its_shard_and_rank_0_the_manifest_last(written: Path) -> None:
    folder = written / "step-00000020"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", SHARD0, SHARD1]  # no tmp files left
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "volt-ckpt/1" and manifest["step"] == 20 and manifest["world_size"] == 2
    assert [s["rank"] for s in manifest["shards"]] == [0, 1]
    assert [s["file"] for s in manifest["shards"]] == [SHARD0, SHARD1]
    for shard in manifest["shards"]:
        assert (folder / shard["file"]).stat().st_size == shard["bytes"]
        assert len(shard["sha256"]) == 64
    # Last: the manifest was renamed into place after both shards were complete.
    shard_mtimes = [(folder / name).stat().st_mtime_ns for name in (SHARD0, SHARD1)]
    assert (folder / "manifest.json").stat().st_mtime_ns >= max(shard_mtimes)
    assert manifest["meta"] == {"test": True}


def test_intact_checkpoints_are_synchronized_and_load_in_rank_order(written: Path) -> None:
    found = volt_ckpt.scan(written)
    assert [(e["step"], e["synchronized"], e["reason"], e["world_size"]) for e in found] == [
        (10, True, "", 2),
        (20, True, "", 2),
    ]
    assert all(e["bytes"] > 0 and e["created"] for e in found)
    # How long each save held training, as the goodput ledger counts it (jobs/goodput.py).
    assert all(0 < e["save_s"] < 60 for e in found)
    assert volt_ckpt.latest_synchronized(written)["step"] == 20
    manifest, shards = volt_ckpt.load(written / "step-00000020")
    assert manifest["step"] == 20
    assert [shard["rank"] for shard in shards] == [0, 1]
    assert shards[1]["weights"][3].item() == 6.0


def test_missing_manifest_is_not_synchronized(root: Path) -> None:
    (root / "step-00000020" / "manifest.json").unlink()
    found = entry(root, 20)
    assert (found["synchronized"], found["reason"], found["created"], found["world_size"]) == (
        False,
        "no manifest",
        None,
        None,
    )
    assert volt_ckpt.latest_synchronized(root)["step"] == 10


def test_truncated_shard_is_not_synchronized(root: Path) -> None:
    shard = root / "step-00000020" / SHARD1
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:12])
    found = entry(root, 20)
    assert not found["synchronized"]
    assert found["reason"] == f"{SHARD1} truncated: 12 of {size} bytes"
    assert volt_ckpt.latest_synchronized(root)["step"] == 10


def test_checksum_mismatch_is_not_synchronized(root: Path) -> None:
    shard = root / "step-00000020" / SHARD0
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    shard.write_bytes(bytes(data))
    found = entry(root, 20)
    assert not found["synchronized"]
    assert found["reason"] == f"{SHARD0} checksum mismatch"
    assert volt_ckpt.latest_synchronized(root)["step"] == 10
    with pytest.raises(volt_ckpt.CheckpointError, match="checksum mismatch"):
        volt_ckpt.load(root / "step-00000020")


def test_missing_shard_is_not_synchronized(root: Path) -> None:
    (root / "step-00000020" / SHARD1).unlink()
    found = entry(root, 20)
    assert (found["synchronized"], found["reason"]) == (False, f"{SHARD1} missing")
    assert found["shards_present"] == 1
    assert volt_ckpt.latest_synchronized(root)["step"] == 10


def test_checkpoint_cut_short_by_a_lost_rank_is_never_resumed_from(root: Path) -> None:
    """Rank 1 dies at step 30's checkpoint: rank 0 wrote its shard, the barrier failed, no manifest."""
    reported = run_save(str(root), 30, die_before_save=1)
    assert reported[0][0] == "error", reported  # rank 0's gather saw its peer gone
    folder = root / "step-00000030"
    assert sorted(p.name for p in folder.iterdir()) == [SHARD0]
    found = entry(root, 30)
    assert (found["synchronized"], found["reason"], found["shards_present"]) == (False, "no manifest", 1)
    assert volt_ckpt.latest_synchronized(root)["step"] == 20
    with pytest.raises(volt_ckpt.CheckpointError, match="no manifest"):
        volt_ckpt.load(folder)


def test_nothing_synchronized_means_no_checkpoint_to_resume(root: Path) -> None:
    for folder in root.iterdir():
        (folder / "manifest.json").unlink()
    assert volt_ckpt.latest_synchronized(root) is None
    assert volt_ckpt.latest_synchronized(root / "absent") is None
    assert volt_ckpt.scan(root / "absent") == []


def test_a_manifest_that_lies_is_not_trusted(root: Path) -> None:
    folder = root / "step-00000020"
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "world_size": 3}))
    assert entry(root, 20)["reason"] == "manifest lists 2 shards for world size 3"
    (folder / "manifest.json").write_text(json.dumps({**manifest, "step": 40}))
    assert entry(root, 20)["reason"] == "manifest says step 40, folder is step-00000020"
    (folder / "manifest.json").write_text("{not json")
    assert entry(root, 20)["reason"].startswith("manifest unreadable")
    shards = [{**manifest["shards"][0], "file": "../elsewhere.pt"}, manifest["shards"][1]]
    (folder / "manifest.json").write_text(json.dumps({**manifest, "shards": shards}))
    assert "outside the checkpoint" in entry(root, 20)["reason"]
    assert volt_ckpt.latest_synchronized(root)["step"] == 10


def test_other_folders_are_ignored(root: Path) -> None:
    (root / "notes").mkdir()
    (root / "step-abc").mkdir()
    (root / "step-00000005.tmp").write_text("x")
    assert [e["step"] for e in volt_ckpt.scan(root)] == [10, 20]


def test_scan_cli_prints_the_list_as_json(root: Path) -> None:
    (root / "step-00000010" / SHARD0).unlink()
    script = Path(volt_ckpt.__file__)
    result = subprocess.run(
        [sys.executable, str(script), "scan", str(root)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [(e["step"], e["synchronized"], e["reason"]) for e in listed] == [
        (10, False, f"{SHARD0} missing"),
        (20, True, ""),
    ]
    latest = subprocess.run(
        [sys.executable, str(script), "latest", str(root)], capture_output=True, text=True, timeout=120
    )
    assert json.loads(latest.stdout)["step"] == 20


def test_events_round_trip_and_prefixed_lines_parse() -> None:
    line = volt_ckpt.event_line("step", step=3, loss=1.5, time=12.0)
    assert line.startswith("VOLT_EVENT {")
    assert volt_ckpt.parse_event(line) == {"kind": "step", "step": 3, "loss": 1.5, "time": 12.0}
    assert volt_ckpt.parse_event("(TrainRank pid=1, ip=127.0.0.2) " + line)["step"] == 3
    for junk in ("", "hello", "VOLT_EVENT {oops", 'VOLT_EVENT ["kind"]', 'VOLT_EVENT {"step": 1}', None):
        assert volt_ckpt.parse_event(junk) is None
    text = "noise\n" + line + "\n" + volt_ckpt.event_line("done", step=3, params_sha256="ab") + "\n"
    assert [e["kind"] for e in volt_ckpt.parse_events(text)] == ["step", "done"]


def test_busbw_follows_nccl_tests() -> None:
    fields = volt_ckpt.busbw_fields(step=5, nbytes=4_000_000_000, seconds=2.0, world_size=4)
    assert fields["algbw_gbps"] == pytest.approx(2.0)
    assert fields["busbw_gbps"] == pytest.approx(2.0 * 2 * 3 / 4)
    assert fields["world_size"] == 4 and fields["bytes"] == 4_000_000_000
    assert volt_ckpt.busbw_fields(1, 10, 0.0, 2)["busbw_gbps"] == 0.0
