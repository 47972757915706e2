"""ray_nodes.job_processes: a job's processes on one host are those carrying both the host's node marker
and the job's marker (real processes, through the local driver); kill=True leaves none."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from clusters.provisioning import ray_nodes
from inventory.drivers.local import LocalDriver


def spawn(node_marker: str, job_marker: str | None) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], ray_nodes.NODE_MARKER_VAR: node_marker}
    if job_marker:
        env[ray_nodes.JOB_MARKER_VAR] = job_marker
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_finds_and_kills_only_this_jobs_processes_on_this_host(tmp_path):
    cluster_id = f"volt-test-{os.getpid()}"
    (tmp_path / "home").mkdir()
    here = LocalDriver(tmp_path, "127.0.0.77")
    ours = spawn(f"{cluster_id}@127.0.0.77", f"{cluster_id}/job-1")
    other_job = spawn(f"{cluster_id}@127.0.0.77", f"{cluster_id}/job-2")
    other_host = spawn(f"{cluster_id}@127.0.0.78", f"{cluster_id}/job-1")  # same /proc, another host's node
    node_only = spawn(f"{cluster_id}@127.0.0.77", None)  # the Ray node itself
    try:
        time.sleep(0.3)
        assert ray_nodes.job_processes(here, cluster_id, f"{cluster_id}/job-1") == [ours.pid]
        assert ray_nodes.job_processes(here, cluster_id, f"{cluster_id}/job-1", kill=True) == []
        assert ours.wait(5) != 0
        assert all(p.poll() is None for p in (other_job, other_host, node_only))
    finally:
        for process in (ours, other_job, other_host, node_only):
            process.kill()
            process.wait(5)


def test_a_marker_with_shell_characters_is_refused(tmp_path):
    with pytest.raises(ValueError):
        ray_nodes.job_processes(LocalDriver(tmp_path, "127.0.0.77"), "volt-x", "job'; rm -rf /")
