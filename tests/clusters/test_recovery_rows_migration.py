"""Migration 0012: a recovery's JSON list of resubmitted jobs becomes RecoveryJob rows, nothing lost."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("clusters", "0011_bandwidth_sample_source_provider")]
AFTER = [("clusters", "0012_recovery_job_rows")]


@pytest.mark.django_db(transaction=True)
def test_json_job_entries_become_rows_with_the_same_figures():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    team = old.get_model("voltweb", "Team").objects.create(name="Old Lab", slug="old-lab")
    cluster = old.get_model("clusters", "Cluster").objects.create(
        team=team, name="old", status="ready", spec={"nodes": 2, "gpus_per_node": 8}
    )
    resubmitted = timezone.now()
    entries = [
        {"job": 41, "name": "train", "attempt": 2, "last_step": 25, "checkpoint_step": 20,
         "checkpoint_path": "/s/step-00000020", "steps_lost": 5, "steps_lost_is_lower_bound": True,
         "step_s": 0.4, "gpus": 16, "resubmitted_at": resubmitted.isoformat(), "training_resumed_at": None,
         "gpu_hours_lost": 0.0929},
        {"job": 41, "attempt": 2, "resubmitted_at": resubmitted.isoformat()},  # the same attempt twice: once
        {"job": 42, "attempt": 3},  # no time at all, and the record has none: left out, not invented
    ]  # fmt: skip
    old.get_model("clusters", "Recovery").objects.create(cluster=cluster, cause="node-1 failed", jobs=entries)

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    rows = list(new.get_model("clusters", "RecoveryJob").objects.values())
    assert len(rows) == 1
    row = rows[0]
    assert (row["job_id"], row["attempt"], row["checkpoint_step"], row["steps_lost"]) == (41, 2, 20, 5)
    assert row["steps_lost_is_lower_bound"] is True and row["gpu_hours_lost"] == pytest.approx(0.0929)
    assert row["resubmitted_at"] == resubmitted and row["training_resumed_at"] is None

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # the rest of the database back to the latest
