"""The live parts of the console: the cluster page's live section, the probe button, the overview."""

from __future__ import annotations

import pytest

from clusters import transitions
from clusters.models import Cluster

from .conftest import spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(alice, rack, client_for, committed):
    with committed():
        response = client_for(alice).post("/api/v1/clusters/", spec(), format="json")
    Cluster.objects.filter(pk=response.json()["id"]).update(dashboard_url="http://127.0.0.1:1")
    cluster = transitions.transition(Cluster.objects.get(pk=response.json()["id"]), "verifying", "joined")
    return transitions.transition(cluster, "ready", "probe passed")


def test_cluster_page_is_live_without_reloading_itself(ready, alice, client):
    client.force_login(alice)
    page = client.get(f"/clusters/{ready.pk}/").content.decode()
    assert f'data-ws="/ws/clusters/{ready.pk}/"' in page and 'id="health-table"' in page
    assert "/static/plotly/plotly.min.js" in page and "/static/volt/cluster_live.js" in page
    assert "location.reload" not in page
    assert client.get("/static/plotly/plotly.min.js").status_code == 200


def test_probe_button_queues_a_probe_for_members_only(
    ready, alice, bob, client, monkeypatch, django_capture_on_commit_callbacks
):
    queued = []
    monkeypatch.setattr("clusters.tasks.probe_cluster_task.delay", queued.append)
    client.force_login(bob)
    assert client.post(f"/clusters/{ready.pk}/probe/").status_code == 404

    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/clusters/{ready.pk}/probe/", HTTP_X_REQUESTED_WITH="fetch")
    assert response.status_code == 202 and response.json()["queued"] and queued == [ready.pk]
    assert ready.events.last().message == "bandwidth probe requested by alice"


def test_overview_counts_healthy_and_degraded_clusters_of_my_teams(ready, alice, bob, client):
    transitions.transition(ready, "degraded", "node failed")
    client.force_login(alice)
    page = client.get("/clusters/overview/").content.decode()
    assert 'id="count-clusters-degraded" class="state state-failed">1<' in page
    assert 'href="/clusters/overview/" class="active">Overview<' in page  # in the navigation bar
    assert 'data-ws="/ws/overview/"' in page and "hx-trigger" not in page  # live, not polled
    client.force_login(bob)
    page = client.get("/clusters/overview/").content.decode()
    assert 'id="count-clusters-degraded" class="">0<' in page
