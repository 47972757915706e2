"""Issue 9 point 9: the placement preview plans only over what the caller may request with and shows
only hosts the hosts API shows that caller."""

import pytest
from django.test import Client

from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh(make_user):
    return make_user("fresh")


@pytest.fixture
def omar_with_hosts(omar, helios, helios_roce, make_host):
    return [make_host(helios_roce.blocks.first(), model="A100", price="1.10") for _ in range(2)]


def test_caller_without_team_gets_no_plan(fresh, omar, rack, omar_with_hosts, client_for):
    """A fresh user and another provider's admin may request nothing: no plan naming Northwind's hosts."""
    for user in (fresh, omar):
        response = client_for(user).post("/api/v1/placements/preview", spec(), format="json")
        assert response.status_code == 403
        assert "team" in response.json()["error"]["message"]
        assert "h100" not in response.content.decode().lower()


def test_console_preview_without_team_shows_no_hosts(fresh, rack):
    client = Client()
    client.force_login(fresh)
    response = client.post("/clusters/preview/", {"nodes": 2, "gpus_per_node": 8, "gpu_models": "H100"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "join a team" in html
    assert not any(host.name in html for hosts in rack.values() for host in hosts)


def test_team_member_plan_names_only_hosts_the_hosts_api_shows(
    alice, rack, make_host, northwind_ib, client_for
):
    """A cordoned host is hidden from researchers: it must never appear in their plan either."""
    from inventory.choices import HostState

    hidden = make_host(northwind_ib.blocks.first(), price="0.50", state=HostState.CORDONED)
    client = client_for(alice)
    visible = {h["id"] for h in client.get("/api/v1/hosts/?limit=500").json()["results"]}
    assert hidden.pk not in visible
    plan = client.post("/api/v1/placements/preview", spec(nodes=5), format="json").json()
    assert plan["placed"]
    assert {n["host_id"] for n in plan["nodes"]} <= visible
