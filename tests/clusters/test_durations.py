"""Requested durations (issue 28.2): a cluster carries `duration_s` from placement; near its end the
timeline warns, at its end Volt terminates it, unless a team member extended it. The clock is passed in
(`now`): the outer seam."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import durations
from clusters.models import Cluster
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def timed(alice, client_for, committed, rack) -> Cluster:
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(duration_s=4 * 3600), format="json")
    assert response.status_code == 202, response.json()
    cluster = Cluster.objects.get(pk=response.json()["id"])
    assert cluster.status == "provisioning"
    return cluster


def messages(cluster: Cluster) -> list[str]:
    return list(cluster.events.values_list("message", flat=True))


def test_the_duration_runs_from_placement_and_the_api_shows_the_time_left(timed, alice, client_for):
    assert timed.ends_at == timed.placed_at + timedelta(hours=4)
    shown = client_for(alice).get(f"/api/v1/clusters/{timed.pk}/").json()
    assert shown["spec"]["duration_s"] == 14400
    assert 14000 < shown["time_left_s"] <= 14400
    assert shown["ends_at"].startswith(f"{timed.ends_at:%Y-%m-%dT%H:%M}")


def test_a_cluster_is_warned_once_before_its_end_then_terminated_at_it(timed, committed):
    end = timed.ends_at
    assert durations.expire_clusters(now=end - timedelta(minutes=30)) == {"warned": 0, "terminated": 0}
    with committed():
        assert durations.expire_clusters(now=end - timedelta(minutes=9)) == {"warned": 1, "terminated": 0}
        assert durations.expire_clusters(now=end - timedelta(minutes=5)) == {"warned": 0, "terminated": 0}
    warning = f"its requested duration ends at {end:%Y-%m-%d %H:%M} UTC (in 9m); Volt terminates it then"
    assert any(m.startswith(warning) for m in messages(timed))
    with committed():
        assert durations.expire_clusters(now=end + timedelta(seconds=1)) == {"warned": 0, "terminated": 1}
    timed.refresh_from_db()
    assert timed.status == "terminated" and not timed.allocations.filter(active=True).exists()
    assert "its requested duration (4h, with extensions) ran out" in messages(timed)


def test_an_extended_cluster_outlives_its_first_end_and_is_warned_again_before_the_new_one(
    timed, alice, client_for, committed
):
    end = timed.ends_at
    durations.expire_clusters(now=end - timedelta(minutes=5))
    response = client_for(alice).post(
        f"/api/v1/clusters/{timed.pk}/extend/", {"seconds": 7200}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["ends_at"].startswith(f"{end + timedelta(hours=2):%Y-%m-%dT%H:%M}")
    timed.refresh_from_db()
    assert timed.end_warned_at is None
    line = timed.events.last()
    assert line.actor == alice and line.message.startswith("extended by 2h by alice: now ends at ")
    with committed():
        assert durations.expire_clusters(now=end + timedelta(minutes=1)) == {"warned": 0, "terminated": 0}
        assert durations.expire_clusters(now=end + timedelta(minutes=115))["warned"] == 1
    timed.refresh_from_db()
    assert timed.status == "provisioning"


def test_extensions_are_for_the_team_of_a_running_cluster_with_a_duration(
    timed, alice, bob, root, client_for, committed
):
    url = f"/api/v1/clusters/{timed.pk}/extend/"
    assert client_for(bob).post(url, {"seconds": 600}, format="json").status_code == 404  # not visible
    refused = client_for(root).post(url, {"seconds": 600}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "team_members_only"
    bad = client_for(alice).post(url, {"seconds": 5}, format="json")
    assert bad.status_code == 400 and "seconds" in bad.json()["error"]["fields"]
    with committed():
        plain = client_for(alice).post("/api/v1/clusters/", spec(nodes=1, name="plain"), format="json").json()
    conflict = client_for(alice).post(
        f"/api/v1/clusters/{plain['id']}/extend/", {"seconds": 600}, format="json"
    )
    assert conflict.status_code == 409
    assert conflict.json()["error"]["message"] == "plain has no requested duration: it runs until terminated."
    assert plain["time_left_s"] is None


@pytest.mark.parametrize("value", [10, 31 * 24 * 3600, "4h", -60])
def test_a_duration_out_of_range_is_refused_on_the_field(alice, client_for, rack, value):
    response = client_for(alice).post("/api/v1/clusters/", spec(duration_s=value), format="json")
    assert response.status_code == 400 and "duration_s" in response.json()["error"]["fields"]


def test_the_page_shows_the_end_and_a_team_member_extends_it(timed, alice, root, client):
    client.force_login(alice)
    page = client.get(f"/clusters/{timed.pk}/").content.decode()
    # A busy machine can take over half a second from placement to the page: 3h 59m is the same answer.
    assert 'id="cluster-ends"' in page and ("(in 4h)" in page or "(in 3h 59m)" in page)
    response = client.post(f"/clusters/{timed.pk}/extend/", {"hours": "2"}, follow=True)
    timed.refresh_from_db()
    assert f"{timed.name} now ends at {timed.ends_at:%Y-%m-%d %H:%M} UTC." in response.content.decode()
    assert timed.ends_at == timed.placed_at + timedelta(hours=6)
    client.force_login(root)  # a platform admin sees the cluster but is not of its team
    assert client.post(f"/clusters/{timed.pk}/extend/", {"hours": "1"}).status_code == 403
    client.force_login(alice)
    for hours in ("3", "²", ""):  # "²".isdigit() is true, int("²") raised: a 500 before
        refused = client.post(f"/clusters/{timed.pk}/extend/", {"hours": hours}, follow=True).content.decode()
        assert "Extend by one of 1, 2, 4, 8, 24 hours." in refused


def test_the_form_and_the_cli_send_a_duration(client, alice, committed, rack):
    from tests.clusters.test_console import FORM
    from voltweb import cli

    client.force_login(alice)
    page = client.post("/clusters/new/", FORM | {"duration": "forever"}).content.decode()
    assert "is not a duration: write 90s, 30m, 4h or 2d" in page
    with committed():
        client.post("/clusters/new/", FORM | {"duration": "90m"})
    assert Cluster.objects.get().spec["duration_s"] == 5400
    args = cli.build_parser().parse_args(
        ["clusters", "create", "--nodes", "2", "--gpu", "H100:8", "--duration", "4h"]
    )
    assert cli.build_spec(args)["duration_s"] == 14400
    args = cli.build_parser().parse_args(["clusters", "extend", "7", "--by", "2h"])
    assert (args.id, args.by) == (7, 7200)
    for bad in ("inf", "nan", "1e999"):  # int(round(inf)) was a traceback
        assert cli.main(["clusters", "extend", "7", "--by", bad]) == 1


def test_an_end_already_past_is_extended_from_now_and_a_cluster_ending_meanwhile_is_not_warned(timed, alice):
    past = timed.ends_at - timedelta(hours=5)
    Cluster.objects.filter(pk=timed.pk).update(ends_at=past)
    timed.refresh_from_db()
    before = timezone.now()
    extended = durations.extend(timed, alice, 3600)
    assert extended.ends_at >= before + timedelta(hours=1)
    stale = Cluster.objects.get(pk=timed.pk)  # read as provisioning, then it moves on
    Cluster.objects.filter(pk=timed.pk).update(status="terminating")
    assert durations._warn(stale, extended.ends_at - timedelta(minutes=5)) == 0
