"""Issue 23, item 7: a provider (or platform) admin uploads nccl-tests all_reduce_perf output for a set of
hosts; Volt keeps it as a bandwidth sample of the domain those hosts span, shows it as "measured by the
provider" beside its own figures, and refuses what it cannot read, naming the line."""

from pathlib import Path

import pytest

from clusters import planning
from clusters.models import BandwidthSample
from inventory import services as inventory
from inventory.choices import FabricKind
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db

CAPTURES = Path(__file__).parent.parent / "inventory" / "captures"
ONE_NODE = (CAPTURES / "nccl_all_reduce_1x8_h100.txt").read_text()
TWO_NODES = (CAPTURES / "nccl_all_reduce_2x8_h100.txt").read_text()
URL = "/api/v1/bandwidth-samples/"


def upload(client, hosts, output):
    return client.post(URL, {"hosts": [h.pk for h in hosts], "output": output}, format="json")


@pytest.fixture
def pair(northwind_ib, make_host):
    """Two Northwind H100 hosts in block r01 of an NDR fabric (400 GB/s per host declared)."""
    block = northwind_ib.blocks.order_by("name").first()
    return [make_host(block), make_host(block)]


def test_a_provider_admin_uploads_a_two_node_run_as_the_block_s_measured_figure(
    priya, pair, client_for, client
):
    response = upload(client_for(priya), pair, TWO_NODES)

    assert response.status_code == 201, response.json()
    body = response.json()
    block = pair[0].block
    assert (body["level"], body["domain_id"], body["source"]) == ("block", str(block.pk), "provider")
    assert body["busbw_gbps"] == 352.19 and body["predicted_gbps"] == 400.0 and body["nodes"] == 2
    assert body["details"]["machines"] == ["dgx-h100-07", "dgx-h100-08"] and body["details"]["ranks"] == 16
    assert body["details"]["average_busbw_gbps"] == 114.565
    sample = BandwidthSample.objects.get(pk=body["id"])
    assert sample.uploaded_by == priya and not sample.source_local

    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{pair[0].pk}/").content.decode()
    assert 'id="measured-table"' in page and "measured by the provider" in page
    assert f"block {block.name}" in page and "352.2" in page


def test_a_one_node_run_is_the_host_s_own_figure(priya, pair, client_for, client):
    response = upload(client_for(priya), pair[:1], ONE_NODE)

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["level"], body["domain_id"], body["busbw_gbps"]) == ("host", str(pair[0].pk), 483.91)
    assert body["predicted_gbps"] is None  # Volt predicts nothing inside one host
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{pair[0].pk}/").content.decode()
    assert f"this host ({pair[0].name})" in page and "483.9" in page


def test_placement_takes_a_provider_figure_below_its_prediction_and_volt_s_own_over_it(
    priya, alice, pair, client_for
):
    assert upload(client_for(priya), pair, TWO_NODES).status_code == 201

    preview = client_for(alice).post("/api/v1/placements/preview", spec(nodes=2), format="json").json()
    assert preview["predicted_busbw_gbps"] == 352.19  # measured by the provider, below the 400 declared

    planning.record_bandwidth_sample("block", str(pair[0].block_id), 390.0)  # Volt's own probe
    preview = client_for(alice).post("/api/v1/placements/preview", spec(nodes=2), format="json").json()
    assert preview["predicted_busbw_gbps"] == 390.0


def test_a_provider_figure_never_raises_a_prediction(northwind, iad1, priya, alice, make_host, client_for):
    hdr = inventory.create_fabric(northwind, iad1, "iad1-hdr", FabricKind.IB_HDR, 200.0, 1.0, ["h01"])
    hosts = [make_host(hdr.blocks.first()) for _ in range(2)]

    body = upload(client_for(priya), hosts, TWO_NODES).json()

    assert body["busbw_gbps"] == 352.19 and body["predicted_gbps"] == 200.0  # kept as measured
    preview = client_for(alice).post("/api/v1/placements/preview", spec(nodes=2), format="json").json()
    assert preview["predicted_busbw_gbps"] == 200.0  # ...but placement never predicts above 200


def test_truncated_or_unknown_output_is_refused_naming_the_line(priya, pair, client_for):
    client = client_for(priya)
    cut = "\n".join(TWO_NODES.splitlines()[:-3])

    truncated = upload(client, pair, cut)
    assert truncated.status_code == 400
    error = truncated.json()["error"]
    assert error["code"] == "unreadable_output"
    assert "ends at line 54" in error["message"] and "before '# Avg bus bandwidth'" in error["message"]

    unknown = upload(client, pair, "Hello from rank 0\n" + TWO_NODES).json()["error"]
    assert "line 1: 'Hello from rank 0'" in unknown["message"]
    assert not BandwidthSample.objects.exists()


def test_the_hosts_named_must_be_the_run_s(priya, pair, client_for):
    refused = upload(client_for(priya), pair[:1], TWO_NODES)

    assert refused.status_code == 400 and refused.json()["error"]["code"] == "hosts_mismatch"
    assert (
        "ran on 2 machine(s) (dgx-h100-07, dgx-h100-08) but 1 host(s) were named"
        in (refused.json()["error"]["message"])
    )


def test_only_the_hosts_provider_admins_and_platform_admins_upload(
    alice, omar, helios, root, pair, client_for, api_client_anonymous
):
    assert upload(client_for(alice), pair, TWO_NODES).status_code == 403  # a researcher
    other = upload(client_for(omar), pair, TWO_NODES)  # Helios's admin, Northwind's hosts
    assert other.status_code == 400 and other.json()["error"]["code"] == "unknown_hosts"
    assert upload(api_client_anonymous, pair, TWO_NODES).status_code == 401
    assert upload(client_for(root), pair, TWO_NODES).status_code == 201
    assert BandwidthSample.objects.get().uploaded_by == root


@pytest.fixture
def api_client_anonymous():
    from tests.conftest import api_client

    return api_client()


def test_the_cluster_page_shows_the_provider_s_figure_of_the_block_it_spans(
    priya, alice, team_a, pair, client_for, client
):
    from clusters.models import Cluster

    upload(client_for(priya), pair, TWO_NODES)
    block = pair[0].block
    path = [block.fabric.site.region, str(block.fabric.site_id), str(block.fabric_id), str(block.pk)]
    cluster = Cluster.objects.create(
        team=team_a,
        created_by=alice,
        name="c1",
        spec=spec(),
        plan={
            "placed": True,
            "spanned_level": "block",
            "spanned_domain": path,
            "nodes": [],
            "explanation": [],
        },
    )

    client.force_login(alice)
    page = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert 'id="measured-figures"' in page and "this cluster&#x27;s block" in page
    assert "measured by the provider" in page and "352.2" in page
