"""What every Volt task does when the row it was sent for is gone."""

from __future__ import annotations

import logging

import pytest

from clusters import tasks as cluster_tasks
from inventory import tasks as inventory_tasks

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "task",
    [
        cluster_tasks.place_cluster_task,
        cluster_tasks.provision_cluster_task,
        cluster_tasks.terminate_cluster_task,
        inventory_tasks.onboard_host_task,
    ],
)
def test_a_task_for_a_row_that_does_not_exist_does_nothing_and_says_so(task, caplog):
    caplog.set_level(logging.WARNING, logger="voltweb.taskutils")

    result = task.apply(args=(987654,))

    assert result.successful() and result.get() == "gone"
    assert f"{task.name}(987654,): nothing to do" in caplog.text
    assert "matching query does not exist" in caplog.text


def test_an_idempotent_task_retries_when_the_database_was_briefly_unavailable(monkeypatch):
    """The decorator's retry_on was never passed, so no task retried: a poll that met SQLite's "database is
    locked" (issue 24, item 1) was lost until the next beat. Placement, the queue, sweeps and job polls retry."""
    from django.db import OperationalError

    from clusters import services

    calls = []

    def locked_once(cluster_id):
        calls.append(cluster_id)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return type("Placed", (), {"status": "provisioning"})()

    monkeypatch.setattr(services, "place_cluster", locked_once)

    result = cluster_tasks.place_cluster_task.apply(args=(41,), throw=False)

    assert result.successful() and result.get() == "provisioning"
    assert calls == [41, 41]


def test_a_task_does_not_retry_an_error_that_says_something_of_the_work(monkeypatch):
    from clusters import services

    calls = []

    def broken(cluster_id):
        calls.append(cluster_id)
        raise ValueError("a real bug")

    monkeypatch.setattr(services, "place_cluster", broken)

    result = cluster_tasks.place_cluster_task.apply(args=(42,), throw=False)

    assert result.failed() and calls == [42]
