"""The inventory API as researchers, provider admins, platform admins and pipelines see it."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.choices import HostState
from inventory.models import Host
from tests.inventory.test_onboarding_rules import ssh_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def inventory(northwind, northwind_ib, helios, helios_roce, add_local_host):
    """Two providers: Northwind (H100 x2 in iad1, one failed host) and Helios (A100 in ams1)."""
    return {
        "h1": add_local_host(northwind, northwind_ib, "iad1-h100-01", price="2.49"),
        "h2": add_local_host(
            northwind, northwind_ib, "iad1-h100-02", price="2.19", block=northwind_ib.blocks.get(name="r02")
        ),
        "bad": add_local_host(northwind, northwind_ib, "iad1-bad", faults={"nvidia_smi_garbage": ""}),
        "a1": add_local_host(helios, helios_roce, "ams1-a100-01", model="A100", price="1.29"),
    }


def names(response) -> list[str]:
    return sorted(row["name"] for row in response.json()["results"])


def test_team_b_researcher_gets_404_on_team_a(alice, bob, team_a, client_for):
    assert client_for(alice).get(f"/api/v1/teams/{team_a.pk}/").status_code == 200
    response = client_for(bob).get(f"/api/v1/teams/{team_a.pk}/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert [t["slug"] for t in client_for(bob).get("/api/v1/teams/").json()["results"]] == ["lab-b"]


def test_researchers_see_only_available_hosts_without_access_details(alice, inventory, client_for):
    client = client_for(alice)
    assert names(client.get("/api/v1/hosts/")) == ["ams1-a100-01", "iad1-h100-01", "iad1-h100-02"]
    detail = client.get(f"/api/v1/hosts/{inventory['h1'].pk}/").json()
    assert "address" not in detail and "ssh_host_key" not in detail
    assert client.get(f"/api/v1/hosts/{inventory['bad'].pk}/").status_code == 404


def test_provider_admin_sees_own_hosts_in_every_state_and_nothing_else(priya, inventory, client_for):
    client = client_for(priya)
    assert names(client.get("/api/v1/hosts/")) == ["iad1-bad", "iad1-h100-01", "iad1-h100-02"]
    detail = client.get(f"/api/v1/hosts/{inventory['bad'].pk}/").json()
    assert detail["state"] == "failed" and detail["error_code"] == "parse_failed"
    assert detail["address"].startswith("127.0.")


def test_provider_admin_cannot_see_or_change_another_providers_host(omar, inventory, client_for):
    client = client_for(omar)
    theirs = inventory["h1"].pk
    assert client.get(f"/api/v1/hosts/{theirs}/").status_code == 404
    assert client.post(f"/api/v1/hosts/{theirs}/cordon/").status_code == 404
    assert client.get(f"/api/v1/hosts/{theirs}/events/").status_code == 404
    assert Host.objects.get(pk=theirs).state == HostState.AVAILABLE
    assert not [g for g in client.get("/api/v1/gpus/").json()["results"] if g["host"] == theirs]


def test_researcher_who_sees_a_host_still_cannot_change_it(alice, inventory, client_for):
    response = client_for(alice).post(f"/api/v1/hosts/{inventory['h1'].pk}/drain/")
    assert response.status_code == 404


def test_provider_admin_drains_and_sees_history(priya, inventory, client_for):
    client = client_for(priya)
    host = inventory["h1"]
    response = client.post(f"/api/v1/hosts/{host.pk}/drain/", {"reason": "maintenance Friday"}, format="json")
    assert response.status_code == 202 and response.json()["state"] == "draining"
    events = client.get(f"/api/v1/hosts/{host.pk}/events/").json()["results"]
    assert events[0]["to_state"] == "draining" and events[0]["message"] == "maintenance Friday"
    assert events[0]["actor"] == "priya"


def test_illegal_action_is_a_409_naming_the_current_state(priya, inventory, client_for):
    response = client_for(priya).post(f"/api/v1/hosts/{inventory['h1'].pk}/uncordon/")
    assert response.status_code == 409
    body = response.json()["error"]
    assert body["code"] == "illegal_transition" and "available" in body["message"]


def test_host_filters(alice, inventory, client_for):
    client = client_for(alice)
    assert names(client.get("/api/v1/hosts/?model=h100")) == ["iad1-h100-01", "iad1-h100-02"]
    assert names(client.get("/api/v1/hosts/?region=eu-west")) == ["ams1-a100-01"]
    assert names(client.get("/api/v1/hosts/?interconnect=infiniband&max_price=2.20")) == ["iad1-h100-02"]
    assert names(client.get("/api/v1/hosts/?interconnect=roce&min_free_gpus=8")) == ["ams1-a100-01"]
    assert names(client.get("/api/v1/hosts/?site=iad1&min_free_gpus=9")) == []
    ordered = client.get("/api/v1/hosts/?ordering=-price_per_gpu_hour").json()["results"]
    assert [h["name"] for h in ordered] == ["iad1-h100-01", "iad1-h100-02", "ams1-a100-01"]


def test_gpu_list_filters_and_pagination(alice, inventory, client_for):
    client = client_for(alice)
    page = client.get("/api/v1/gpus/?model=H100&page_size=5").json()
    assert page["count"] == 16 and len(page["results"]) == 5 and page["next"]
    assert {g["model"] for g in page["results"]} == {"H100-SXM"}  # the family matches its variants
    assert client.get("/api/v1/gpus/?region=eu-west").json()["count"] == 8


def test_offers_aggregate_free_capacity(alice, inventory, client_for, priya):
    client_for(priya).post(f"/api/v1/hosts/{inventory['h2'].pk}/cordon/")
    offers = client_for(alice).get("/api/v1/offers/").json()["results"]
    assert [(o["gpu_model"], o["region"], o["fabric_kind"], o["free_gpus"], o["hosts"]) for o in offers] == [
        ("A100-80GB", "eu-west", "roce", 8, 1),
        ("H100-SXM", "us-east", "ib_ndr", 8, 1),
    ]
    filtered = client_for(alice).get("/api/v1/offers/?interconnect=infiniband").json()["results"]
    assert [o["gpu_model"] for o in filtered] == ["H100-SXM"]
    assert filtered[0]["min_price_per_gpu_hour"] == "2.49"


def test_list_endpoints_do_not_query_per_row(
    alice, inventory, client_for, northwind, northwind_ib, add_local_host
):
    client = client_for(alice)

    client.get("/api/v1/teams/")  # the token's first use of the minute writes last_used_at once

    def count(url):
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx.captured_queries)

    before = {url: count(url) for url in ("/api/v1/hosts/", "/api/v1/gpus/", "/api/v1/offers/")}
    for i in range(3):
        add_local_host(northwind, northwind_ib, f"more-{i}")
    after = {url: count(url) for url in before}
    assert after == before


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "provider"),
        (
            {
                "provider": "northwind",
                "name": "x",
                "block": 999999,
                "driver": "local",
                "price_per_gpu_hour": "1",
            },
            "block",
        ),
        (
            {"provider": "northwind", "name": "bad name!", "driver": "local", "price_per_gpu_hour": "1"},
            "name",
        ),
        ({"provider": "northwind", "name": "x", "driver": "teleport", "price_per_gpu_hour": "1"}, "driver"),
        (
            {"provider": "northwind", "name": "x", "driver": "local", "price_per_gpu_hour": "-1"},
            "price_per_gpu_hour",
        ),
        (
            {"provider": "northwind", "name": "x", "driver": "local", "price_per_gpu_hour": "cheap"},
            "price_per_gpu_hour",
        ),
    ],
)
def test_malformed_host_input_gets_400_with_field_message(
    priya, northwind, northwind_ib, client_for, payload, field
):
    response = client_for(priya).post("/api/v1/hosts/", payload, format="json")
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["code"] == "invalid" and field in body["fields"]
    assert not Host.objects.exists()


def test_local_host_without_spec_or_with_unknown_model_is_400(priya, northwind, northwind_ib, client_for):
    block = northwind_ib.blocks.first().pk
    base = {
        "provider": "northwind",
        "name": "x",
        "block": block,
        "driver": "local",
        "price_per_gpu_hour": "1",
    }
    client = client_for(priya)
    assert "local_spec" in client.post("/api/v1/hosts/", base, format="json").json()["error"]["fields"]
    response = client.post(
        "/api/v1/hosts/", base | {"local_spec": {"gpu_model": "TPUv5", "gpu_count": 8}}, format="json"
    )
    assert response.status_code == 400 and "local_spec" in response.json()["error"]["fields"]
    response = client.post(
        "/api/v1/hosts/", base | {"local_spec": {"gpu_model": "H100", "gpu_count": 99}}, format="json"
    )
    assert response.status_code == 400


def test_ssh_host_needs_address(priya, northwind, northwind_ib, client_for):
    block = northwind_ib.blocks.first().pk
    body = {"provider": "northwind", "name": "x", "block": block, "driver": "ssh", "price_per_gpu_hour": "1"}
    response = client_for(priya).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 400 and "address" in response.json()["error"]["fields"]


@pytest.mark.parametrize(
    "endpoint", ["203.0.113.7", "203.0.113.7:0", "203.0.113.7:70000", "a b:51821", ":51821"]
)
def test_a_forwarded_udp_port_that_is_not_address_colon_port_is_refused_saying_so(
    priya, northwind, northwind_ib, client_for, endpoint
):
    block = northwind_ib.blocks.first().pk
    body = {"provider": "northwind", "name": "x", "block": block, "driver": "ssh", "price_per_gpu_hour": "1",
            "address": "10.0.4.19", "overlay_endpoint": endpoint}  # fmt: skip
    response = client_for(priya).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 400
    assert "e.g. 203.0.113.7:51821" in str(response.json()["error"]["fields"]["overlay_endpoint"])
    assert not Host.objects.filter(name="x").exists()


def test_a_hosts_forwarded_udp_port_is_kept_and_shown(priya, northwind, northwind_ib, client_for):
    block = northwind_ib.blocks.first().pk
    body = {"provider": "northwind", "name": "x", "block": block, "driver": "ssh", "price_per_gpu_hour": "1",
            "address": "10.0.4.19", "overlay_endpoint": "gw.northwind.example:51821", "ssh_user": "volt",
            "ssh_private_key": ssh_key()}  # fmt: skip
    created = client_for(priya).post("/api/v1/hosts/", body, format="json")  # onboarding waits for a commit
    assert created.status_code == 202, created.json()
    assert client_for(priya).get(f"/api/v1/hosts/{created.json()['id']}/").json()["overlay_endpoint"] == (
        "gw.northwind.example:51821"
    )


def test_adding_a_host_to_another_providers_block_is_refused(
    omar, helios, northwind_ib, client_for, settings
):
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True  # as in the demo
    block = northwind_ib.blocks.first().pk
    body = {
        "provider": "helios",
        "name": "sneaky",
        "block": block,
        "driver": "local",
        "price_per_gpu_hour": "1",
        "local_spec": {"gpu_model": "H100", "gpu_count": 8},
    }
    response = client_for(omar).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 400 and "block" in response.json()["error"]["fields"]


def test_adding_a_host_for_a_provider_you_do_not_manage_is_400(omar, northwind, northwind_ib, client_for):
    """As for a provider that does not exist (issue 9.10: no oracle): see tests/security/test_oracles.py."""
    body = {
        "provider": "northwind",
        "name": "x",
        "block": northwind_ib.blocks.first().pk,
        "driver": "local",
        "price_per_gpu_hour": "1",
        "local_spec": {"gpu_model": "H100", "gpu_count": 8},
    }
    response = client_for(omar).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["provider"] == ["No provider 'northwind' among yours."]


def test_adding_a_host_returns_202_and_onboards(
    priya, northwind, northwind_ib, client_for, committed, settings
):
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True  # as in the demo
    body = {
        "provider": "northwind",
        "name": "new-a100",
        "block": northwind_ib.blocks.first().pk,
        "driver": "local",
        "price_per_gpu_hour": "1.10",
        "local_spec": {"gpu_model": "A100", "gpu_count": 4},
    }
    with committed():
        response = client_for(priya).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 202 and response.json()["state"] == "onboarding"
    host = client_for(priya).get(f"/api/v1/hosts/{response.json()['id']}/").json()
    assert host["state"] == "available" and host["gpu_count"] == 4


def test_duplicate_host_name_is_400(priya, inventory, northwind_ib, client_for, settings):
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True  # as in the demo
    body = {
        "provider": "northwind",
        "name": "iad1-h100-01",
        "block": northwind_ib.blocks.first().pk,
        "driver": "local",
        "price_per_gpu_hour": "1",
        "local_spec": {"gpu_model": "A100", "gpu_count": 4},
    }
    response = client_for(priya).post("/api/v1/hosts/", body, format="json")
    assert response.status_code == 400 and "name" in response.json()["error"]["fields"]


def test_bad_filter_values_are_400_not_500(alice, inventory, client_for):
    client = client_for(alice)
    for query in (
        "max_price=cheap",
        "min_free_gpus=-1",
        "interconnect=carrier-pigeon",
        "page=abc",
        "ordering=zzz",
    ):
        response = client.get(f"/api/v1/hosts/?{query}")
        assert response.status_code in (200, 400, 404), query
        assert response.status_code != 500


def test_provider_registration_approval_flow(priya, root, client_for, make_user):
    newbie = make_user("nia")
    created = client_for(newbie).post("/api/v1/providers/", {"name": "Nebula Racks"}, format="json")
    assert created.status_code == 201 and created.json()["status"] == "pending"
    slug = created.json()["slug"]
    assert client_for(newbie).post(f"/api/v1/providers/{slug}/approve/").status_code == 403
    assert client_for(priya).get(f"/api/v1/providers/{slug}/").status_code == 404
    approved = client_for(root).post(f"/api/v1/providers/{slug}/approve/")
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    duplicate = client_for(priya).post("/api/v1/providers/", {"name": "nebula racks"}, format="json")
    assert duplicate.status_code == 400 and "name" in duplicate.json()["error"]["fields"]


def test_suspended_providers_hosts_are_not_offered(alice, make_user, client_for, iad1, add_local_host):
    from inventory import services

    owner = make_user("pending-owner")
    provider = services.review_provider(services.register_provider(owner, "Pending Co"), approve=True)
    fabric = services.create_fabric(provider, iad1, "p-ib", "ib_ndr", 400.0, 1.0, ["p1"])
    host = add_local_host(provider, fabric, "p-h100")
    assert host.state == HostState.AVAILABLE
    services.review_provider(provider, approve=False)
    assert client_for(alice).get("/api/v1/offers/").json()["results"] == []
    assert client_for(owner).get("/api/v1/hosts/").json()["count"] == 1


def test_fabric_creation_through_the_api(priya, northwind, iad1, client_for):
    body = {
        "provider": "northwind",
        "site": iad1.pk,
        "name": "iad1-roce",
        "kind": "roce",
        "block_names": ["x1", "x2"],
    }
    response = client_for(priya).post("/api/v1/fabrics/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["blocks"] == ["x1", "x2"] and response.json()["per_host_gbytes_per_s"] == 200.0
