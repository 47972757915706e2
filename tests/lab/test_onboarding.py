"""Volt's own SSH onboarding, unchanged, onboards lab machines through their gates: discovery sees each
machine's declared (simulated) GPUs and NICs, its host key is pinned, and the host Volt reaches is that
machine (its own host name)."""

from __future__ import annotations

import pytest

from inventory import health, services
from inventory.choices import HostState
from tests.lab.conftest import onboard_machine

pytestmark = [pytest.mark.django_db]

TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5}},
    "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400}},
    "machines": [
        {
            "name": "nw-01",
            "provider": "northwind",
            "fabric": "iad1-ndr",
            "block": "r1",
            "gpu_model": "H100",
            "gpu_count": 8,
        },
        {
            "name": "nw-02",
            "provider": "northwind",
            "fabric": "iad1-ndr",
            "block": "r1",
            "gpu_model": "A100",
            "gpu_count": 4,
        },
    ],
}


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


def test_lab_machines_are_onboarded_through_their_gates_by_the_ssh_driver(lab, northwind, northwind_ib):
    hosts = {name: onboard_machine(lab, northwind, northwind_ib, name) for name in ("nw-01", "nw-02")}

    for host in hosts.values():
        assert host.state == HostState.AVAILABLE, host.error_message
    assert (hosts["nw-01"].gpu_model, hosts["nw-01"].gpu_count) == ("H100-SXM", 8)
    assert (hosts["nw-02"].gpu_model, hosts["nw-02"].gpu_count) == ("A100-80GB", 4)
    assert [p["rate_gbps"] for p in hosts["nw-01"].discovery["ib_ports"]] == [400] * 8
    assert hosts["nw-01"].discovered_gbytes_per_s == 400.0
    uuids = {name: set(host.gpus.values_list("uuid", flat=True)) for name, host in hosts.items()}
    assert not uuids["nw-01"] & uuids["nw-02"]  # two machines, two sets of GPUs

    for name, host in hosts.items():
        assert host.ssh_host_key == lab.status().machine(name).host_key  # each machine's own, pinned
        driver = services.driver_for(host)
        try:
            assert driver.run("hostname").stdout.strip() == name
            assert driver.run("sudo -n true").ok
        finally:
            driver.close()

    assert health.health_sweep() == {"ok": 2}
