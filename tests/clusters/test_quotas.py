"""Team quotas (issue 28 item 3): what a researcher and a platform admin see when a team has a cap on GPUs
in use (in all and per model) and a GPU-hour budget per month."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clusters import quotas, services
from clusters.models import Allocation, Cluster
from tests.clusters.conftest import spec
from voltweb.models import TeamEvent

pytestmark = pytest.mark.django_db


def request(client, committed, **overrides):
    with committed():
        response = client.post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 202, response.json()
    return Cluster.objects.get(pk=response.json()["id"])


def set_quota(client, team, committed, method="put", **limits):
    with committed():
        response = getattr(client, method)(f"/api/v1/teams/{team.pk}/quota/", limits, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def terminate(client, committed, cluster):
    with committed():
        assert client.post(f"/api/v1/clusters/{cluster.pk}/terminate/").status_code == 202


def test_a_request_larger_than_the_cap_is_refused_saying_what_to_do(
    alice, root, team_a, rack, client_for, committed
):
    set_quota(client_for(root), team_a, committed, max_gpus=16)

    response = client_for(alice).post("/api/v1/clusters/", spec(nodes=3), format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "over_quota"
    assert "allows 16 GPUs in use at once and this request asks for 24" in error["message"]
    assert "Request at most 16 GPUs, or ask a platform admin to raise Lab A's quota" in error["message"]
    assert not Cluster.objects.exists()


def test_a_request_larger_than_every_model_cap_asked_is_refused(
    alice, root, team_a, rack, client_for, committed
):
    set_quota(client_for(root), team_a, committed, gpu_model_caps={"H100": 8})
    response = client_for(alice).post("/api/v1/clusters/", spec(nodes=2), format="json")
    assert response.status_code == 400 and "allows 8 H100 GPUs" in response.json()["error"]["message"]


def test_an_over_cap_request_queues_with_the_figure_and_starts_when_the_teams_other_cluster_ends(
    alice, root, team_a, rack, client_for, committed
):
    set_quota(client_for(root), team_a, committed, max_gpus=16)
    client = client_for(alice)
    first = request(client, committed, nodes=2)
    second = request(client, committed, nodes=1, name="second")

    data = client.get(f"/api/v1/clusters/{second.pk}/").json()
    assert first.status == "provisioning" and data["status"] == "queued"
    assert data["queue_reason"] == "over quota: Lab A would use 24 of 16 GPUs (16 in use + 8 asked)"
    assert not Allocation.objects.filter(cluster=second).exists()  # the rack had room: only the quota held it

    terminate(client, committed, first)

    second.refresh_from_db()
    assert second.status == "provisioning" and second.queue_reason == ""
    assert Allocation.objects.filter(cluster=second, active=True).count() == 8


def test_a_model_cap_steers_an_any_of_request_to_a_model_with_room_and_queues_when_none_has(
    alice, root, team_a, rack, northwind_ib, make_host, client_for, committed
):
    make_host(northwind_ib.blocks.order_by("name").last(), model="A100-80GB", gpus=8)
    set_quota(client_for(root), team_a, committed, gpu_model_caps={"H100": 8, "A100": 8})
    client = client_for(alice)
    request(client, committed, nodes=1)  # 8 H100: the H100 cap is full

    either = request(client, committed, nodes=1, name="either", gpu_models=["H100", "A100"])
    assert (either.status, either.gpu_model) == ("provisioning", "A100-80GB")

    third = request(client, committed, nodes=1, name="third", gpu_models=["H100", "A100"])
    assert third.status == "queued"
    assert third.queue_reason == "over quota: Lab A would use 16 of 8 H100 GPUs (8 in use + 8 asked)"


def test_an_exhausted_monthly_budget_queues_until_a_platform_admin_raises_it(
    alice, root, team_a, rack, client_for, committed
):
    client = client_for(alice)
    earlier = request(client, committed, nodes=1)
    Allocation.objects.filter(cluster=earlier).update(allocated_at=timezone.now() - timedelta(hours=2))
    terminate(client, committed, earlier)  # 8 GPUs x 2 hours held this month
    set_quota(client_for(root), team_a, committed, gpu_hours_per_month=10)

    waiting = request(client, committed, nodes=1, name="waiting")

    assert waiting.status == "queued"
    assert waiting.queue_reason.startswith("over quota: Lab A used 16.0 of 10 GPU-hours this month")
    assert "the budget renews" in waiting.queue_reason

    set_quota(client_for(root), team_a, committed, method="patch", gpu_hours_per_month=100)
    waiting.refresh_from_db()
    assert waiting.status == "provisioning"


def test_gpu_hours_this_month_count_only_the_allocations_time_inside_the_month(
    alice, team_a, rack, client_for, committed
):
    cluster = request(client_for(alice), committed, nodes=1)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    Allocation.objects.filter(cluster=cluster).update(
        allocated_at=start - timedelta(days=2), active=False, released_at=start + timedelta(hours=3)
    )
    other = request(client_for(alice), committed, nodes=1, name="still-running")
    Allocation.objects.filter(cluster=other).update(allocated_at=start + timedelta(days=1))
    now = start + timedelta(days=1, minutes=30)

    use = quotas.use_of([team_a.pk], now=now)[team_a.pk]

    assert use.gpu_hours_this_month == pytest.approx(8 * 3 + 8 * 0.5)
    assert use.gpus_in_use == 8 and use.gpus_by_model == {"H100": 8}


def test_every_quota_change_is_audited_with_who_and_what(root, team_a, client_for, committed):
    client = client_for(root)
    set_quota(client, team_a, committed, max_gpus=16, gpu_model_caps={"H100": 8})
    body = set_quota(client, team_a, committed, method="patch", gpu_hours_per_month=500)
    set_quota(client, team_a, committed, method="patch", gpu_hours_per_month=500)  # no change: no line

    lines = list(TeamEvent.objects.filter(team=team_a).order_by("at", "id"))
    assert [e.actor for e in lines] == [root, root]
    assert lines[0].message == "quota changed by root: GPUs in use no limit -> 16; H100 GPUs no limit -> 8"
    assert lines[1].message == "quota changed by root: GPU-hours per month no limit -> 500"
    assert lines[1].details == {
        "before": {"max_gpus": 16, "gpu_model_caps": {"H100": 8}, "gpu_hours_per_month": None},
        "after": {"max_gpus": 16, "gpu_model_caps": {"H100": 8}, "gpu_hours_per_month": 500},
    }
    assert body["max_gpus"] == 16 and body["gpu_hours_per_month"] == 500  # PATCH kept the cap
    assert [c["message"] for c in body["changes"]] == [lines[1].message, lines[0].message]


def test_only_platform_admins_change_quotas(alice, bob, root, team_a, client_for):
    url = f"/api/v1/teams/{team_a.pk}/quota/"
    refused = client_for(alice).put(url, {"max_gpus": 1000}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "platform_admins_only"
    assert client_for(alice).get(url).status_code == 200  # a member reads the team's quota
    assert client_for(bob).get(url).status_code == 404  # another team's: not found, as everywhere
    assert client_for(bob).patch(url, {"max_gpus": 1}, format="json").status_code == 404

    console = Client()
    console.force_login(alice)
    assert console.post(f"/teams/{team_a.pk}/quota/", {f"q{team_a.pk}-max_gpus": "999"}).status_code == 403
    assert not TeamEvent.objects.exists()


def test_a_platform_admin_sets_a_quota_from_the_teams_page(root, team_a):
    console = Client()
    console.force_login(root)
    p = f"q{team_a.pk}-"
    data = {p + "max_gpus": "32", p + "gpu_model_caps": "H100=16, A100-80GB=8", p + "gpu_hours_per_month": ""}
    response = console.post(f"/teams/{team_a.pk}/quota/", data)
    assert response.status_code == 302
    team_a.quota.refresh_from_db()
    assert team_a.quota.as_json() == {
        "max_gpus": 32,
        "gpu_model_caps": {"H100": 16, "A100-80GB": 8},
        "gpu_hours_per_month": None,
    }
    assert TeamEvent.objects.get(team=team_a).actor == root
    page = console.get("/teams/").content.decode()
    assert 'value="H100=16, A100-80GB=8"' in page and "quota changed by root" in page


def test_bad_quota_values_are_refused_naming_the_field(root, team_a, client_for):
    response = client_for(root).put(
        f"/api/v1/teams/{team_a.pk}/quota/", {"max_gpus": -1, "gpu_model_caps": {"H100": 8}}, format="json"
    )
    assert response.status_code == 400 and "max_gpus" in response.json()["error"]["fields"]


def test_the_team_page_shows_use_against_the_quota(alice, root, team_a, rack, client_for, committed):
    set_quota(
        client_for(root), team_a, committed, max_gpus=16, gpu_model_caps={"H100": 8}, gpu_hours_per_month=1000
    )
    request(client_for(alice), committed, nodes=1)
    console = Client()
    console.force_login(alice)

    page = console.get("/teams/").content.decode()

    assert "8 of 16 GPUs (50%)" in page
    assert "8 of 8 H100 GPUs" in page
    assert "0.0 of 1000 GPU-hours" in page
    assert "Save quota" not in page  # the form is for platform admins
    body = client_for(alice).get(f"/api/v1/teams/{team_a.pk}/quota/").json()
    assert body["use"]["gpus_in_use"] == 8
    assert body["use"]["gpus_by_model"] == [{"model": "H100", "in_use": 8, "cap": 8}]


def test_the_placement_preview_says_over_quota_with_the_figure_before_the_request_is_made(
    alice, root, team_a, rack, client_for, committed
):
    """Issue 28 item 3's gap: the preview planned against free capacity only, so it showed a plan for a
    request that would then queue "over quota"; it now says so, with the figure, and what happens."""
    set_quota(client_for(root), team_a, committed, max_gpus=16)
    client = client_for(alice)
    assert client.post("/api/v1/placements/preview", spec(nodes=2), format="json").json()["placed"] is True
    request(client, committed, nodes=2)  # 16 in use

    body = client.post("/api/v1/placements/preview", spec(nodes=1), format="json").json()
    assert body["placed"] is False
    assert body["reasons"] == [
        "over quota: Lab A would use 24 of 16 GPUs (16 in use + 8 asked): the request would queue until it fits"
    ]
    never = client.post("/api/v1/placements/preview", spec(nodes=3), format="json").json()
    assert never["placed"] is False and "allows 16 GPUs in use at once" in never["reasons"][0]


def test_django_admin_shows_a_teams_quota_read_only(root, team_a, client_for, committed):
    """A platform admin in Django's admin sees the quota on the team's page; changes go through the audited
    path (the Teams page, the API), so the admin offers no field to edit it."""
    set_quota(client_for(root), team_a, committed, max_gpus=16, gpu_model_caps={"H100": 8})
    page = Client()
    page.force_login(root)
    html = page.get(f"/admin/voltweb/team/{team_a.pk}/change/").content.decode()
    assert "change it on the console" in html and "H100" in html
    assert 'name="quota-0-max_gpus"' not in html  # read-only: no input


def test_an_over_cap_request_gets_its_start_bound_from_its_teams_requested_ends(
    alice, root, team_a, rack, client_for, committed
):
    """No starvation over quota either (issue 28.2): the bound is when the team's own clusters leave room,
    from their durations; where they have none, the request says so instead of a bound."""
    set_quota(client_for(root), team_a, committed, max_gpus=16)
    client = client_for(alice)
    first = request(client, committed, nodes=1, duration_s=2 * 3600, name="two-hours")
    forever = request(client, committed, nodes=1, name="no-duration")
    waiting = request(client, committed, nodes=1, duration_s=3600, name="waiting")
    assert (first.status, forever.status, waiting.status) == ("provisioning", "provisioning", "queued")

    with committed():
        services.drain_queue()

    data = client.get(f"/api/v1/clusters/{waiting.pk}/").json()
    first.refresh_from_db()
    assert data["queue_reason"] == "over quota: Lab A would use 24 of 16 GPUs (16 in use + 8 asked)"
    assert data["starts_by"].startswith(f"{first.ends_at:%Y-%m-%dT%H:%M:%S}")
    assert data["start_bound_note"] == ""

    # Without the duration of the cluster whose end would make room, there is no bound, and it says why.
    Cluster.objects.filter(pk=first.pk).update(ends_at=None, spec={**first.spec, "duration_s": None})
    with committed():
        services.drain_queue()
    data = client.get(f"/api/v1/clusters/{waiting.pk}/").json()
    assert data["starts_by"] is None
    assert data["start_bound_note"].startswith("no start bound while over quota: Lab A would use 24 of 16")
    assert data["start_bound_note"].endswith("the team's clusters holding its quota have no duration "
                                             "(a bound is set once they have an end)")  # fmt: skip


def test_two_over_cap_requests_of_one_team_never_count_on_the_same_room(
    alice, root, team_a, rack, client_for, committed
):
    """Cap 16, two running 8-GPU clusters (ending at 2 h and 3 h), two queued 8-GPU 1 h requests: the first
    starts by 2 h; at 2 h its own reservation takes the room, so the second starts by its end, not at 2 h."""
    set_quota(client_for(root), team_a, committed, max_gpus=16)
    client = client_for(alice)
    two = request(client, committed, nodes=1, duration_s=2 * 3600, name="two-hours")
    request(client, committed, nodes=1, duration_s=3 * 3600, name="three-hours")
    first = request(client, committed, nodes=1, duration_s=3600, name="first")
    second = request(client, committed, nodes=1, duration_s=3600, name="second")

    with committed():
        services.drain_queue()

    two.refresh_from_db()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == ("queued", "queued")
    assert first.reserved_from == two.ends_at
    assert second.reserved_from == first.reserved_until == two.ends_at + timedelta(hours=1)


def test_a_reservation_is_not_placed_where_the_projected_budget_is_spent(
    alice, root, team_a, rack, client_for, committed
):
    """Cap 16 and 30 GPU-hours a month, two running 8-GPU clusters ending at 2 h and 3 h: by 2 h the team
    will have used 32 GPU-hours, so the queued request cannot start then (admission would refuse it); it is
    reserved from the budget's renewal. Before, the bound said 2 h and was missed."""
    set_quota(client_for(root), team_a, committed, max_gpus=16, gpu_hours_per_month=30)
    client = client_for(alice)
    request(client, committed, nodes=1, duration_s=2 * 3600, name="two-hours")
    request(client, committed, nodes=1, duration_s=3 * 3600, name="three-hours")
    waiting = request(client, committed, nodes=1, duration_s=3600, name="waiting")

    with committed():
        services.drain_queue()

    waiting.refresh_from_db()
    assert waiting.status == "queued"
    assert waiting.reserved_from == quotas.next_month_start(timezone.now())

    # With room in the budget at 2 h (a platform admin raises it), the bound is the first cluster's end.
    set_quota(client_for(root), team_a, committed, method="patch", gpu_hours_per_month=1000)
    with committed():
        services.drain_queue()
    waiting.refresh_from_db()
    assert waiting.reserved_from == Cluster.objects.get(name="two-hours").ends_at
