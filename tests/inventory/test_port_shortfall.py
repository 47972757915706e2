"""Issue 23, item 5: a host's ports against its fabric's declared per-host bandwidth. Onboarding counts
the ports up that carry the fabric's traffic (count x rate, per transport, Ethernet included); a
shortfall warns on the host (page, API, events) and on the provider's page, and placement predicts from
the smaller figure."""

from decimal import Decimal

import pytest

from inventory import services
from inventory.choices import DriverKind, FabricKind, HostEventKind, HostState
from inventory.discovery.network import fabric_warnings, injection
from inventory.discovery.types import IbPort
from tests.clusters.conftest import spec

pytestmark = pytest.mark.django_db

ONE_HDR_PORT = [{"name": "mlx5_0", "link_layer": "InfiniBand", "rate_gbps": 200}]
EIGHT_HDR_PORTS = [{"name": f"mlx5_{i}", "link_layer": "InfiniBand", "rate_gbps": 200} for i in range(8)]


@pytest.fixture
def hdr(northwind, iad1):
    """An InfiniBand HDR fabric declared at 200 GB/s per host (8 x 200 Gb/s)."""
    return services.create_fabric(northwind, iad1, "iad1-hdr", FabricKind.IB_HDR, 200.0, 1.0, ["h01"])


@pytest.fixture
def ethernet(northwind, iad1):
    """A 100 GbE fabric declared at 12.5 GB/s per host."""
    return services.create_fabric(northwind, iad1, "iad1-eth", FabricKind.ETH_100G, 12.5, 1.0, ["e01"])


def onboard(provider, fabric, name, nics):
    request = services.HostRequest(
        name=name,
        block=fabric.blocks.first(),
        driver=DriverKind.LOCAL,
        price_per_gpu_hour=Decimal("2.49"),
        local_spec={"gpu_model": "H100", "gpu_count": 8, "nics": nics},
    )
    return services.onboard_host(services.add_host(provider, request, queue=False).pk)


def test_one_200g_port_on_a_fabric_declared_at_200_gbytes_per_host_warns_on_the_host_and_the_provider(
    northwind, hdr, priya, client, client_for
):
    host = onboard(northwind, hdr, "one-port", ONE_HDR_PORT)

    assert host.state == HostState.AVAILABLE  # a warning, not a failure
    assert host.discovered_gbytes_per_s == 25.0
    [warning] = host.discovery["network_warnings"]  # the port itself runs at HDR's rate: no port warning
    assert "the ports give 25 GB/s per host (1 x 200 Gb/s InfiniBand)" in warning
    assert "below the 200 GB/s the fabric InfiniBand HDR (iad1-hdr) declares per host" in warning
    assert "placement predicts from 25 GB/s" in warning
    assert host.events.filter(kind=HostEventKind.ERROR, message__contains="the ports give 25 GB/s").exists()

    api = client_for(priya).get(f"/api/v1/hosts/{host.pk}/").json()
    assert api["network_warnings"] == [warning] and api["discovered_gbytes_per_s"] == 25.0
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert "the ports give 25 GB/s per host" in page
    provider_page = client.get(f"/inventory/providers/{northwind.slug}/").content.decode()
    assert 'id="port-shortfalls"' in provider_page and "one-port" in provider_page
    assert "25 GB/s from its ports (1 x 200 Gb/s InfiniBand) against 200 GB/s declared" in provider_page


def test_a_plan_using_a_host_short_of_ports_predicts_from_its_ports_not_the_fabric(
    northwind, hdr, alice, client_for
):
    short = onboard(northwind, hdr, "one-port", ONE_HDR_PORT)
    full = onboard(northwind, hdr, "eight-ports", EIGHT_HDR_PORTS)
    assert (short.discovered_gbytes_per_s, full.discovered_gbytes_per_s) == (25.0, 200.0)
    assert full.discovery["network_warnings"] == []

    body = client_for(alice).post("/api/v1/placements/preview", spec(nodes=2), format="json").json()

    assert body["predicted_busbw_gbps"] == 25.0  # not the 200 GB/s the fabric declares
    assert any(f"ports: host {short.pk} injects 25 GB/s" in line for line in body["explanation"])
    one = client_for(alice).post("/api/v1/placements/preview", spec(nodes=1), format="json").json()
    assert one["predicted_busbw_gbps"] is None  # one node: nothing crosses the ports


def test_an_ethernet_fabric_is_checked_the_same_way(northwind, ethernet, alice, priya, client, client_for):
    slow = onboard(
        northwind,
        ethernet,
        "eth-25g",
        [{"name": "mlx5_0", "link_layer": "Ethernet", "rate_gbps": 25, "roce": False}],
    )
    right = onboard(
        northwind,
        ethernet,
        "eth-100g",
        [{"name": "mlx5_0", "link_layer": "Ethernet", "rate_gbps": 100, "roce": False}],
    )

    assert slow.discovered_gbytes_per_s == 3.125 and right.discovered_gbytes_per_s == 12.5
    assert right.discovery["network_warnings"] == []
    [warning] = slow.discovery["network_warnings"]
    assert "the ports give 3.125 GB/s per host (1 x 25 Gb/s Ethernet)" in warning
    assert "below the 12.5 GB/s the fabric Ethernet 100G (iad1-eth) declares per host" in warning
    body = client_for(alice).post("/api/v1/placements/preview", spec(nodes=2), format="json").json()
    assert body["predicted_busbw_gbps"] == 3.125
    client.force_login(priya)
    assert "eth-25g" in client.get(f"/inventory/providers/{northwind.slug}/").content.decode()


def test_an_ethernet_host_whose_ports_discovery_cannot_see_is_said_unconfirmed_and_keeps_the_declared_figure(
    northwind, ethernet
):
    host = onboard(northwind, ethernet, "plain-nic", [])

    assert host.discovered_gbytes_per_s is None
    [warning] = host.discovery["network_warnings"]
    assert "no Ethernet port is up for the fabric Ethernet 100G (iad1-eth)" in warning
    assert "not confirmed" in warning


def port(ca: str, rate: int, link_layer: str = "InfiniBand", state: str = "Active", roce=None) -> IbPort:
    physical = "LinkUp" if state == "Active" else "Disabled"
    return IbPort(ca, 1, state, physical, rate, link_layer, roce=roce)


def test_injection_counts_the_fabric_s_own_ports_up_and_falls_back_to_the_others():
    ports = (
        port("mlx5_0", 400),
        port("mlx5_1", 400, state="Down"),
        port("mlx5_2", 100, "Ethernet", roce=False),
    )

    found = injection(FabricKind.IB_NDR, ports)
    assert (found.gbytes_per_s, found.ports, found.fallback) == (50.0, "1 x 400 Gb/s InfiniBand", False)

    # No InfiniBand port up: NCCL falls back to sockets over the management port, so that is what counts.
    fallback = injection(FabricKind.IB_NDR, (ports[1], ports[2]))
    assert (fallback.gbytes_per_s, fallback.fallback) == (12.5, True)
    [*_, shortfall] = fabric_warnings("ib_ndr", "InfiniBand NDR", (ports[1], ports[2]), 400.0)
    assert "12.5 GB/s per host (1 x 100 Gb/s Ethernet) (none of the fabric's own ports is up)" in shortfall

    assert injection(FabricKind.IB_NDR, ()).gbytes_per_s is None  # nothing seen: nothing known
    # RoCE and plain Ethernet ports both carry an Ethernet fabric.
    mixed = (port("a", 25, "Ethernet", roce=True), port("b", 25, "Ethernet", roce=False))
    assert injection(FabricKind.ETH_25G, mixed).gbytes_per_s == 6.25


def test_eight_ndr_ports_give_exactly_the_declared_400_gbytes_and_do_not_warn():
    ports = tuple(port(f"mlx5_{i}", 400) for i in range(8))

    assert injection(FabricKind.IB_NDR, ports).gbytes_per_s == 400.0
    assert fabric_warnings("ib_ndr", "InfiniBand NDR", ports, 400.0) == []


@pytest.mark.parametrize("kind", list(FabricKind))
def test_a_default_local_host_confirms_its_fabric_whatever_its_gpu_count(
    kind, northwind, iad1, add_local_host
):
    """services.LOCAL_NICS gives each fabric kind's default figure: the demo's small hosts do not warn."""
    fabric = services.create_fabric(northwind, iad1, f"f-{kind}", kind, None, 1.0, ["b1"])

    host = add_local_host(northwind, fabric, f"h-{kind}", gpus=2)

    assert host.discovery["network_warnings"] == []
    assert host.discovered_gbytes_per_s == fabric.per_host_gbytes_per_s
