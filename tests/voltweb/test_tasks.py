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
