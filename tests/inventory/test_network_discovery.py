"""NIC ports at onboarding: transport (InfiniBand / RoCE / plain Ethernet), rate, state, closest GPUs,
sysfs where ibstat is absent, and warnings where they contradict the declared fabric."""

from decimal import Decimal

import pytest

from inventory import services
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.discovery.network import fabric_warnings, parse_sysfs_ports
from inventory.discovery.types import IbPort

pytestmark = pytest.mark.django_db

NDR = [{"name": f"mlx5_{i}", "link_layer": "InfiniBand", "rate_gbps": 400} for i in range(8)]
MANAGEMENT = {"name": "mlx5_8", "link_layer": "Ethernet", "rate_gbps": 100, "roce": False}


def onboard(provider, fabric, name, nics, faults=None):
    request = services.HostRequest(
        name=name,
        block=fabric.blocks.first(),
        driver=DriverKind.LOCAL,
        price_per_gpu_hour=Decimal("2.49"),
        local_spec={"gpu_model": "H100", "gpu_count": 8, "nics": nics},
        local_faults=faults,
    )
    return services.onboard_host(services.add_host(provider, request, queue=False).pk)


def test_management_ethernet_port_is_counted_apart_from_infiniband(northwind, northwind_ib):
    host = onboard(northwind, northwind_ib, "dgx-mgmt", NDR + [MANAGEMENT])

    assert host.state == HostState.AVAILABLE
    assert host.discovery["port_counts"] == {"infiniband": 8, "roce": 0, "ethernet": 1}
    mgmt = host.ports.get(ca="mlx5_8")
    assert (mgmt.link_layer, mgmt.transport, mgmt.rate_gbps, mgmt.state) == (
        "Ethernet",
        "ethernet",
        100,
        "Active",
    )
    ib = host.ports.get(ca="mlx5_0")
    assert (ib.transport, ib.rate_gbps, ib.source) == ("infiniband", 400, "ibstat")
    assert ib.closest_gpus == [0] and ib.gpu_link == "PIX"
    assert host.discovery["network_warnings"] == []
    assert (
        "8 InfiniBand, 0 RoCE, 1 Ethernet" in host.events.filter(kind=HostEventKind.DISCOVERY).first().message
    )


def test_roce_ports_are_roce(helios, helios_roce):
    nics = [{"name": f"mlx5_{i}", "link_layer": "Ethernet", "rate_gbps": 200} for i in range(2)]
    host = onboard(helios, helios_roce, "roce-host", nics)

    assert host.discovery["port_counts"] == {"infiniband": 0, "roce": 2, "ethernet": 0}
    assert set(host.ports.values_list("transport", flat=True)) == {"roce"}


def test_without_ibstat_ports_are_read_from_sysfs_through_the_driver(northwind, northwind_ib):
    host = onboard(northwind, northwind_ib, "no-ibstat", NDR + [MANAGEMENT], faults={"ibstat_missing": ""})

    assert host.state == HostState.AVAILABLE
    assert host.ports.count() == 9 and set(host.ports.values_list("source", flat=True)) == {"sysfs"}
    assert host.discovery["port_counts"] == {"infiniband": 8, "roce": 0, "ethernet": 1}
    assert host.ports.get(ca="mlx5_0").rate_gbps == 400


def test_ports_slower_or_down_than_the_declared_fabric_are_warned_about(
    northwind, northwind_ib, priya, client
):
    nics = [dict(nic, rate_gbps=200) for nic in NDR[:7]] + [dict(NDR[7], state="Down")]
    host = onboard(northwind, northwind_ib, "slow-links", nics)

    assert host.state == HostState.AVAILABLE  # a warning, not a failure
    warnings = host.discovery["network_warnings"]
    assert len(warnings) == 9
    assert "mlx5_0 port 1 runs at 200 Gb/s; the fabric is declared InfiniBand NDR" in warnings[1]
    assert "mlx5_7 port 1 is Down" in warnings[0]
    assert "the ports give 175 GB/s per host (7 x 200 Gb/s InfiniBand), below the 400 GB/s" in warnings[8]
    assert host.events.filter(kind=HostEventKind.ERROR, message__contains="runs at 200 Gb/s").exists()

    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert "runs at 200 Gb/s" in page and "mlx5_7" in page
    api = client.get(f"/api/v1/hosts/{host.pk}/").json()
    assert api["network_warnings"] == warnings
    assert {p["ca"]: p["state"] for p in api["ports"]}["mlx5_7"] == "Down"


def test_declared_infiniband_with_only_ethernet_is_warned_about():
    ports = (IbPort("mlx5_0", 1, "Active", "LinkUp", 100, "Ethernet", roce=False),)

    [warning] = fabric_warnings("ib_ndr", "InfiniBand NDR", ports)

    assert "no InfiniBand port (1 ethernet)" in warning
    assert fabric_warnings("eth_100g", "Ethernet 100G", ports) == []


def test_sysfs_output_parses_into_ports():
    text = (
        "port: /sys/class/infiniband/mlx5_0/ports/1\nstate: 4: ACTIVE\nphys_state: 5: LinkUp\n"
        "rate: 400 Gb/sec (4X NDR)\nlink_layer: InfiniBand\ngid_types: IB/RoCE v1;\n"
        "port: /sys/class/infiniband/mlx5_1/ports/1\nstate: 1: DOWN\nphys_state: 3: Disabled\n"
        "rate: 10 Gb/sec (4X SDR)\nlink_layer: Ethernet\ngid_types: \n"
    )

    a, b = parse_sysfs_ports(text)

    assert (a.ca, a.state, a.physical_state, a.rate_gbps, a.transport, a.is_up) == (
        "mlx5_0",
        "Active",
        "LinkUp",
        400,
        "infiniband",
        True,
    )
    assert (b.ca, b.state, b.transport, b.is_up) == ("mlx5_1", "Down", "ethernet", False)
