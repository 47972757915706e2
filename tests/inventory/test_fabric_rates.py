"""What each emulated link runs at (inventory/fabric_emulation.py, pure part): DESIGN.md's level table,
scaled, with link faults."""

from __future__ import annotations

import pytest

from inventory import fabric_emulation as fe

SCALE = 0.00025


def end(address, region="us-east", site="1", fabric="1", block="1", **extra):
    figures = {"fabric_gbps": 400.0, "oversubscription": 2.0, "backbone_gbps": 12.5}
    return fe.LinkEnd(address, (region, site, fabric, block), **{**figures, **extra})


@pytest.mark.parametrize(
    ("other", "level", "gbps"),
    [
        (end("127.0.9.3"), "block", 400.0),
        (end("127.0.9.3", block="2"), "fabric", 200.0),
        (end("127.0.9.3", fabric="2", block="3"), "site", 12.5),
        (end("127.0.9.3", site="2", fabric="3", block="4"), "region", 1.25),
        (end("127.0.9.3", region="eu-west", site="3", fabric="4", block="5"), "global", 0.125),
    ],
)
def test_two_hosts_run_at_the_finest_level_they_share_times_the_scale(other, level, gbps):
    host = end("127.0.9.2")

    assert fe.common_level(host, other) == level
    assert fe.pair_rate_bytes(host, other, SCALE) == pytest.approx(gbps * 1e9 * SCALE, rel=1e-6)
    assert fe.pair_rate_bytes(other, host, SCALE) == fe.pair_rate_bytes(host, other, SCALE)


def test_the_slower_end_sets_the_rate_of_a_link():
    fast, slow = end("127.0.9.2"), end("127.0.9.3", fabric_gbps=100.0)

    assert fe.pair_rate_bytes(fast, slow, SCALE) == int(100.0 * 1e9 * SCALE)


def test_a_host_whose_ports_give_less_than_declared_crosses_the_spine_at_its_ports_rate():
    """Issue 23 item 2: a 2:1 fabric declared at 400 GB/s per host gives each host 200 across blocks; a host
    whose ports give 100 sends at 100 there too (placement: min(ports, declared / oversubscription)), where
    the emulation divided the ports' figure by the oversubscription (50)."""
    short = end("127.0.9.2", fabric_gbps=100.0, declared_gbps=400.0)
    other = end("127.0.9.3", block="2", declared_gbps=400.0)

    assert fe.pair_rate_bytes(short, other, SCALE) == int(100.0 * 1e9 * SCALE)
    assert fe.pair_rate_bytes(end("127.0.9.4", declared_gbps=400.0), other, SCALE) == int(200.0 * 1e9 * SCALE)


def test_link_faults_slow_every_link_of_their_host_and_only_those():
    healthy, degraded, fallback = (
        end("127.0.9.2"),
        end("127.0.9.3", degraded_pct=25),
        end("127.0.9.4", ib_fallback=True),
    )
    block_rate = int(400.0 * 1e9 * SCALE)

    assert fe.pair_rate_bytes(healthy, degraded, SCALE) == block_rate // 4
    assert fe.pair_rate_bytes(healthy, fallback, SCALE) == int(fe.ETHERNET_CLASS_GBPS * 1e9 * SCALE)
    assert fe.pair_rate_bytes(healthy, end("127.0.9.5"), SCALE) == block_rate


def test_every_ordered_pair_gets_its_own_class_inside_the_install_slot_and_never_a_host_to_itself():
    hosts = [end(f"127.0.9.{i}") for i in range(2, 6)]

    pairs = fe.plan_pairs(hosts, slot=5, scale=SCALE)

    assert len(pairs) == 4 * 3
    assert {(p.src, p.dst) for p in pairs} == {(a.address, b.address) for a in hosts for b in hosts if a != b}
    assert all(p.minor >> 10 == 5 and p.minor & 0x3FF for p in pairs)
    assert len({p.minor for p in pairs}) == len(pairs)
    assert not any("127.0.0.1" in (p.src, p.dst) for p in pairs)


def test_an_install_with_more_links_than_its_slot_holds_is_refused_with_the_numbers():
    hosts = [end(f"127.0.8.{i}") for i in range(2, 36)]

    with pytest.raises(fe.EmulationUnavailable, match="34 local hosts need 1122 shaped links"):
        fe.plan_pairs(hosts, slot=1, scale=SCALE)


def test_emulation_switched_off_says_so_whatever_the_privilege():
    assert fe.unavailable_reason("off") == "VOLT_LOCAL_FABRIC_EMULATION=off"


@pytest.mark.django_db
def test_a_provider_admin_injects_and_clears_a_link_fault_from_the_host_page(
    client, priya, northwind, northwind_ib, add_local_host
):
    host = add_local_host(northwind, northwind_ib, "h0", gpus=2)
    client.force_login(priya)

    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert 'id="inject-fault"' in page and "links not emulated" in page  # tests run with emulation off
    response = client.post(f"/inventory/hosts/{host.pk}/faults/", {"fault": "link_degraded", "value": "25"})
    assert response.status_code == 302
    assert "link_degraded:25" in client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    client.post(f"/inventory/hosts/{host.pk}/faults/", {"fault": "link_degraded", "value": "fast"})
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert "write a percentage of the link rate from 1 to 100" in page

    client.post(f"/inventory/hosts/{host.pk}/faults/", {"clear": "link_degraded"})
    assert "None: a healthy host." in client.get(f"/inventory/hosts/{host.pk}/").content.decode()


@pytest.mark.django_db
def test_the_fault_api_refuses_a_researcher_and_a_bad_value_with_a_400(
    priya, alice, northwind, northwind_ib, add_local_host, client_for
):
    host = add_local_host(northwind, northwind_ib, "h0", gpus=2)

    assert (
        client_for(alice).post(f"/api/v1/hosts/{host.pk}/faults/", {"fault": "ib_fallback"}).status_code
        == 404
    )
    bad = client_for(priya).post(f"/api/v1/hosts/{host.pk}/faults/", {"fault": "link_degraded", "value": "0"})
    assert bad.status_code == 400 and "percentage" in str(bad.json())
    listed = client_for(priya).get(f"/api/v1/hosts/{host.pk}/faults/").json()
    assert listed == {"faults": {}, "links_emulated": False, "links_note": "VOLT_LOCAL_FABRIC_EMULATION=off"}
