"""The demo's terminal lines (issue 24, item 6): a line per cluster state change and per job that ended,
was interrupted or was resubmitted; notes that change no state stay in the log file."""

from __future__ import annotations

import io
import re

from django.core.management.base import OutputWrapper

from clusters.models import Cluster, ClusterEvent
from jobs.models import Job, JobEvent
from voltweb.management.commands.demo import Command


def terminal() -> tuple[Command, io.StringIO]:
    out = io.StringIO()
    command = Command(stdout=out)
    command.stdout = OutputWrapper(out)
    return command, out


def test_the_terminal_names_state_changes_and_jobs_that_fail_but_not_notes(team_a, alice):
    cluster = Cluster.objects.create(team=team_a, created_by=alice, name="c1", status="recovering", spec={})
    job = Job.objects.create(
        cluster=cluster, team=team_a, created_by=alice, name="train", entrypoint="python t.py"
    )
    command, out = terminal()
    seen = (0, 0)
    ClusterEvent.objects.all().delete()
    JobEvent.objects.all().delete()

    ClusterEvent.objects.create(
        cluster=cluster, from_status="ready", to_status="recovering", message="h1 died"
    )
    ClusterEvent.objects.create(
        cluster=cluster, from_status="recovering", to_status="recovering", message="note"
    )
    JobEvent.objects.create(job=job, from_status="running", to_status="interrupted", message="h1 died")
    JobEvent.objects.create(
        job=job, from_status="interrupted", to_status="pending", message="resubmitted as attempt 2"
    )
    JobEvent.objects.create(job=job, from_status="pending", to_status="running", message="Ray says RUNNING")
    JobEvent.objects.create(
        job=job, from_status="running", to_status="failed", message="exit code 1\n\tpid: 10786\n^^^^"
    )
    seen = command._cluster_changes(seen)

    lines = out.getvalue().splitlines()
    # One line each (a multi-line reason's first line), the time in UTC as the console shows it.
    assert all(re.match(r"^\d\d:\d\d:\d\d UTC ", line) for line in lines), lines
    assert [line.split(" UTC ", 1)[1] for line in lines] == [
        f"cluster {cluster.pk} (c1): ready → recovering: h1 died",
        f"job {job.pk} (train) on cluster {cluster.pk}: running → interrupted: h1 died",
        f"job {job.pk} (train) on cluster {cluster.pk}: interrupted → pending: resubmitted as attempt 2",
        f"job {job.pk} (train) on cluster {cluster.pk}: running → failed: exit code 1",
    ]
    assert "recovering → recovering" not in out.getvalue()

    # Read once: a second round with nothing new says nothing.
    assert command._cluster_changes(seen) == seen
    assert out.getvalue().splitlines() == lines
