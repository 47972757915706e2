"""Volt's files are its own: a job runs as another Unix user on local hosts (as root), and on a developer's
machine the demo's database sits beside the hosts' sandboxes. The database, the secrets and Volt's copies of
the teams' code are closed to other users; a job's environment (often a team's credentials) is encrypted at
rest like the other secrets."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from clusters.models import Cluster
from jobs import services as jobs
from jobs.models import Job
from voltweb import datadir

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ready_cluster(team_a, alice):
    return Cluster.objects.create(
        team=team_a, created_by=alice, name="a1", status="ready",
        spec={"nodes": 1, "gpus_per_node": 1, "gpu_models": ["H100"]}, dashboard_url="http://127.0.0.9:1",
    )  # fmt: skip


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_fresh_install_creates_its_database_and_data_dir_closed_to_others(tmp_path):
    """Settings as the demo loads them (SQLite in the data dir): the file exists 0600 before Django opens it,
    and SQLite's side files take the same mode."""
    data_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update(VOLT_DATA_DIR=str(data_dir), DEBUG="1", DJANGO_SETTINGS_MODULE="voltweb.settings")
    code = (
        "import django; django.setup(); from django.db import connection; c = connection.cursor(); "
        "c.execute('PRAGMA journal_mode=WAL'); c.execute('CREATE TABLE t (x)'); c.execute('INSERT INTO t VALUES (1)')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)
    database = data_dir / "volt.sqlite3"
    assert mode(data_dir) == 0o711
    assert mode(database) == 0o600
    for side in data_dir.glob("volt.sqlite3-*"):
        assert mode(side) == 0o600, side


def test_an_existing_database_readable_by_others_is_closed(tmp_path):
    data_dir, database = tmp_path / "var", tmp_path / "var" / "volt.sqlite3"
    data_dir.mkdir(mode=0o755)
    sqlite3.connect(database).close()
    database.chmod(0o644)
    datadir.make_private(data_dir, database)
    assert (mode(data_dir), mode(database)) == (0o711, 0o600)


def test_job_working_dirs_are_closed_to_others(settings, ready_cluster, alice):
    job = jobs.submit_job(ready_cluster, alice, "python train.py")
    assert mode(jobs.workdirs_root()) == 0o700
    assert Path(job.working_dir).parent == jobs.workdirs_root()


def test_a_jobs_environment_is_encrypted_at_rest(ready_cluster, alice, client_for):
    job = jobs.submit_job(ready_cluster, alice, "python train.py", env={"WANDB_API_KEY": "wb-secret-91f3"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM jobs_job WHERE id = %s", [job.pk])
        stored = json.dumps([str(v) for v in cursor.fetchone()])
    assert "wb-secret-91f3" not in stored and "WANDB_API_KEY" not in stored
    assert Job.objects.get(pk=job.pk).env == {"WANDB_API_KEY": "wb-secret-91f3"}
    shown = client_for(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["env"] == {"WANDB_API_KEY": "wb-secret-91f3"}  # its team still sees what it gave
    assert jobs.runtime_env(Job.objects.get(pk=job.pk))["env_vars"]["WANDB_API_KEY"] == "wb-secret-91f3"
