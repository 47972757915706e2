"""Issue 10 placement points 1 and 5 through the database: a PCIe-only host onboarded by real discovery
(the local simulator prints `nvidia-smi topo -m`, the real parsers read it) is placed as one node, and
measured bandwidth from local hosts does not stand for a fabric unless its links were emulated.
"""

import pytest

from clusters import planning, services
from clusters.models import Allocation, Cluster
from inventory.discovery.topo import parse_topo
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db


def test_topo_matrix_groups_pcie_gpus_by_switch_and_numa_node():
    text = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tNODE\tSYS\t0-31\t0
GPU1\tPIX\t X \tNODE\tSYS\t0-31\t0
GPU2\tNODE\tNODE\t X \tSYS\t0-31\t0
GPU3\tSYS\tSYS\tSYS\t X \t32-63\t1
"""
    assert parse_topo(text).pcie_groups() == ([[0, 1], [2], [3]], [[0, 1, 2], [3]])


def test_a_free_four_l40s_host_gives_one_node_its_four_gpus(
    alice, team_a, northwind, northwind_ib, add_local_host, client_for, committed
):
    host = add_local_host(northwind, northwind_ib, "l40s-01", model="L40S", gpus=4, price="0.99")
    assert host.state == "available" and host.nvlink_domain_size == 1  # no NVLink between its GPUs
    assert host.pcie_topology == {"switches": [[0, 1], [2, 3]], "numa": [[0, 1], [2, 3]]}
    offers = client_for(alice).get("/api/v1/offers/").json()["results"]
    assert [o["max_free_gpus_per_host"] for o in offers if o["gpu_model"] == "L40S"] == [4]  # and placement:
    four = spec(nodes=1, gpus_per_node=4, gpu_models=["L40S"])
    body = client_for(alice).post("/api/v1/placements/preview", four, format="json").json()
    assert body["placed"] is True, body
    assert body["nodes"][0]["gpu_indices"] == [0, 1, 2, 3]
    with committed():
        cluster = services.request_cluster(team_a, alice, four)
    cluster = Cluster.objects.get(pk=cluster.pk)
    assert cluster.status in ("provisioning", "verifying", "ready"), cluster.queue_reason
    assert Allocation.objects.filter(cluster=cluster, active=True).count() == 4


def test_a_spec_asking_more_gpus_than_a_pcie_host_has_says_so(alice, northwind, northwind_ib, add_local_host):
    add_local_host(northwind, northwind_ib, "l40s-01", model="L40S", gpus=4, price="0.99")
    with pytest.raises(planning.InvalidSpec, match="the largest L40S host has 4 GPUs"):
        planning.validate_spec(spec(nodes=1, gpus_per_node=5, gpu_models=["L40S"]))


def test_samples_between_local_hosts_count_only_when_their_links_were_emulated(alice, rack, client_for):
    block = rack["r01"][0].block
    planning.record_bandwidth_sample("block", str(block.pk), 1.1, source_local=True)  # plain loopback
    preview = client_for(alice).post("/api/v1/placements/preview", spec(nodes=3), format="json").json()
    assert preview["predicted_busbw_gbps"] == 400.0
    assert not any(line.startswith("measured:") for line in preview["explanation"])
    planning.record_bandwidth_sample("block", str(block.pk), 300.0, source_local=True, emulated=True)
    preview = client_for(alice).post("/api/v1/placements/preview", spec(nodes=3), format="json").json()
    assert preview["predicted_busbw_gbps"] == 300.0
    measured = [line for line in preview["explanation"] if line.startswith("measured:")]
    assert measured == [
        "measured: block us-east/iad1/iad1-ib/r01 at 300 GB/s against 400 GB/s declared "
        "(efficiency 75%, applied to that block's hosts only)"
    ]
