"""Waiting for locality within a bound (issue 28.1): a collective request waits for one site while one
could hold it, says what it waits for and until when, and past the bound is placed across sites with the
warning; a request no site could ever hold never waits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from clusters import services
from clusters.models import Cluster
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db
WAIT = [{"level": "site", "max_wait_s": 1800}]


@pytest.fixture
def two_sites(northwind_ib, helios_roce, make_host):
    """iad1: 3 H100 hosts (one block each side); ams1: 2 H100 hosts. Two sites, two regions."""
    r01, r02 = northwind_ib.blocks.order_by("name")
    a01 = helios_roce.blocks.get()
    return {
        "iad1": [make_host(r01), make_host(r01), make_host(r02)],
        "ams1": [make_host(a01), make_host(a01)],
    }


def request(client, committed, **overrides) -> Cluster:
    with committed():
        response = client.post("/api/v1/clusters/", spec(**overrides), format="json")
    assert response.status_code == 202, response.json()
    return Cluster.objects.get(pk=response.json()["id"])


def sites_of(cluster: Cluster) -> set[str]:
    return set(cluster.nodes.values_list("host__site__name", flat=True))


@pytest.fixture
def busy_iad1_host(alice, client_for, committed, two_sites):
    """One iad1 host taken by a 1-node cluster: iad1 could hold 3 nodes, but has room for 2 now."""
    cluster = request(client_for(alice), committed, name="busy", nodes=1, topology_level="block",
                      topology_mode="required")  # fmt: skip
    assert cluster.status == "provisioning"
    return cluster


def test_a_collective_request_waits_for_one_site_and_says_until_when(
    alice, client_for, committed, busy_iad1_host
):
    client = client_for(alice)
    cluster = request(client, committed, nodes=3, wait_for_locality=WAIT)
    shown = client.get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert shown["status"] == "queued"
    until = cluster.created_at + timedelta(seconds=1800)
    assert shown["queue_reason"].startswith(
        f"waiting for one site until {until:%Y-%m-%d %H:%M} UTC (then anywhere, with a warning): "
    )
    assert shown["spec"]["wait_for_locality"] == WAIT

    # The busy host's cluster ends: one site has room, and the waiting request takes it there.
    with committed():
        client.post(f"/api/v1/clusters/{busy_iad1_host.pk}/terminate/")
    services.drain_queue()
    cluster.refresh_from_db()
    assert cluster.status == "provisioning" and sites_of(cluster) == {"iad1"}
    assert cluster.plan["warnings"] == []


def test_a_locality_bound_that_expires_places_across_sites_with_the_warning(
    alice, client_for, committed, busy_iad1_host
):
    cluster = request(client_for(alice), committed, nodes=3, wait_for_locality=WAIT)
    assert cluster.status == "queued"
    Cluster.objects.filter(pk=cluster.pk).update(created_at=cluster.created_at - timedelta(seconds=1801))

    services.drain_queue()

    cluster.refresh_from_db()
    assert cluster.status == "provisioning"
    assert sites_of(cluster) == {"iad1", "ams1"}
    assert any(
        w.startswith("waited 30 min (its bound) for one site; none had room")
        for w in cluster.plan["warnings"]
    )


def test_a_request_no_site_could_ever_hold_never_waits(alice, client_for, committed, two_sites):
    cluster = request(client_for(alice), committed, nodes=4, wait_for_locality=WAIT)  # iad1 has 3 hosts
    assert cluster.status == "provisioning" and sites_of(cluster) == {"iad1", "ams1"}
    assert not any("waited" in w for w in cluster.plan["warnings"])  # it never waited


def test_a_site_without_the_required_interconnect_is_not_waited_for(
    alice, client_for, committed, busy_iad1_host
):
    """iad1 (InfiniBand) could hold 3 nodes, but none on RoCE: a request requiring RoCE has no site to wait
    for, and fails to fit now (ams1 has 2 RoCE hosts) without a locality wait."""
    cluster = request(client_for(alice), committed, nodes=3, wait_for_locality=WAIT, interconnect=["roce"],
                      interconnect_mode="required")  # fmt: skip
    assert cluster.status == "queued" and not cluster.queue_reason.startswith("waiting for one")


def test_collective_requests_wait_by_default_and_independent_tasks_or_an_empty_wait_do_not(
    alice, client_for, committed, busy_iad1_host, settings
):
    settings.VOLT_LOCALITY_WAIT_S = 1800
    client = client_for(alice)

    def placed_then_ended(**overrides) -> set[str]:
        cluster = request(client, committed, nodes=3, **overrides)
        assert cluster.status == "provisioning", cluster.queue_reason
        sites = sites_of(cluster)
        with committed():
            client.post(f"/api/v1/clusters/{cluster.pk}/terminate/")
        return sites

    # Nothing to all-reduce: independent tasks take the free hosts of both sites at once.
    assert placed_then_ended(name="indep", parallelism="independent") == {"iad1", "ams1"}
    # A request that asks for no wait is placed as written.
    assert placed_then_ended(name="no-wait", wait_for_locality=[]) == {"iad1", "ams1"}
    waiting = request(client, committed, nodes=3, name="dp")
    assert waiting.status == "queued" and waiting.queue_reason.startswith("waiting for one site until ")


@pytest.mark.parametrize(
    "wait, message",
    [([{"level": "planet", "max_wait_s": 60}], '"planet" is not a valid choice.'),
     ([{"level": "site", "max_wait_s": -1}], "greater than or equal to 0"),
     ([{"level": "site", "max_wait_s": 60}, {"level": "site", "max_wait_s": 90}], "Name each level once."),
     ("site:30m", "Expected a list of items"),
     ([None, None], "This field may not be null."),  # schemathesis's: a 500 before
     ],
)  # fmt: skip
def test_bad_waits_are_refused_saying_what_to_write(alice, client_for, two_sites, wait, message):
    response = client_for(alice).post(
        "/api/v1/clusters/", spec(nodes=2, wait_for_locality=wait), format="json"
    )
    assert response.status_code == 400
    assert message in str(response.json()["error"]["fields"]["wait_for_locality"])
    assert not Cluster.objects.exists()


def test_the_console_form_takes_a_wait_and_refuses_a_bad_one_saying_what_to_write(
    client, alice, committed, two_sites
):
    from tests.clusters.test_console import FORM

    client.force_login(alice)
    page = client.post("/clusters/new/", FORM | {"wait_for_locality": "site:soon"}).content.decode()
    assert "is not a duration: write 90s, 30m, 4h or 2d" in page
    assert not Cluster.objects.exists()
    with committed():
        client.post("/clusters/new/", FORM | {"wait_for_locality": "block:10m, site:30m"})
    assert Cluster.objects.get().spec["wait_for_locality"] == [
        {"level": "block", "max_wait_s": 600},
        {"level": "site", "max_wait_s": 1800},
    ]


def test_the_cli_sends_the_waits_it_is_given():
    from voltweb import cli

    args = cli.build_parser().parse_args(
        ["clusters", "create", "--nodes", "3", "--gpu", "H100:8", "--wait-for-locality", "site:30m"]
    )
    assert cli.build_spec(args)["wait_for_locality"] == WAIT
    args = cli.build_parser().parse_args(
        ["clusters", "create", "--nodes", "3", "--gpu", "H100:8", "--no-locality-wait"]
    )
    assert cli.build_spec(args)["wait_for_locality"] == []
    assert "wait_for_locality" not in cli.build_spec(
        cli.build_parser().parse_args(["clusters", "create", "--nodes", "3", "--gpu", "H100:8"])
    )
    assert (
        cli.main(
            ["clusters", "create", "--nodes", "3", "--gpu", "H100:8", "--wait-for-locality", "planet:1h"]
        )
        == 1
    )
