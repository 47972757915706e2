"""A recovery's status moves through the state machine like a cluster's (issue 22): claimed by one UPDATE,
never re-opened, never ended twice. Before, seven places wrote `Recovery.status` directly, so a recovery
that had succeeded could be marked abandoned afterwards."""

from __future__ import annotations

import pytest

from clusters import transitions
from clusters.choices import RecoveryStatus
from clusters.models import Cluster, Recovery
from voltweb.statemachine import IllegalTransition

pytestmark = pytest.mark.django_db


@pytest.fixture
def recovery(team_a, alice):
    cluster = Cluster.objects.create(
        team=team_a, created_by=alice, name="r", status="recovering",
        spec={"nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"]},
    )  # fmt: skip
    return Recovery.objects.create(cluster=cluster, cause="node-1 failed: Ray node process not running")


def test_a_recovery_waits_then_recovers(recovery):
    transitions.move_recovery(recovery, RecoveryStatus.WAITING, waiting_reason="no H100 host free")
    transitions.move_recovery(recovery, RecoveryStatus.ACTIVE, waiting_reason="")
    transitions.move_recovery(recovery, RecoveryStatus.SUCCEEDED, message="recovered")

    stored = Recovery.objects.get(pk=recovery.pk)
    assert (stored.status, stored.message, stored.waiting_reason) == ("succeeded", "recovered", "")


@pytest.mark.parametrize("again", [RecoveryStatus.ABANDONED, RecoveryStatus.FAILED, RecoveryStatus.ACTIVE])
def test_an_ended_recovery_is_never_ended_again_or_reopened(recovery, again):
    transitions.move_recovery(recovery, RecoveryStatus.SUCCEEDED, message="recovered")

    with pytest.raises(IllegalTransition, match="cannot go from succeeded"):
        transitions.move_recovery(Recovery.objects.get(pk=recovery.pk), again, message="late")

    stored = Recovery.objects.get(pk=recovery.pk)
    assert (stored.status, stored.message) == ("succeeded", "recovered")
