"""The demo on lab machines (issue 25 item 4): `seed_demo --lab N` adds lab N's machines as a provider
admin would add real ones — SSH hosts at their gates, host keys pinned, lab addresses as private
addresses — and onboarding and Volt's runtime install run as the tasks they are, until each host is
offered. A lab that is not up, or a topology of providers the demo does not know, is refused with what
to do."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from inventory import services
from inventory.choices import HostState
from inventory.lab import operations
from inventory.models import Host

pytestmark = [pytest.mark.django_db]


def machine(name: str, provider: str, fabric: str, model: str) -> dict:
    return {"name": name, "provider": provider, "fabric": fabric, "block": "r1", "gpu_model": model,
            "gpu_count": 2}  # fmt: skip


TOPOLOGY = {
    "sites": {"iad1": {"region": "us-east", "backbone_gbytes_per_s": 12.5},
              "ord1": {"region": "us-central", "backbone_gbytes_per_s": 12.5}},
    "fabrics": {"iad1-ndr": {"site": "iad1", "kind": "ib_ndr", "per_host_gbytes_per_s": 400},
                "ord1-roce": {"site": "ord1", "kind": "roce", "per_host_gbytes_per_s": 200}},
    "machines": [machine("nw-01", "northwind", "iad1-ndr", "H100"),
                 machine("he-01", "helios", "ord1-roce", "L40S")],
}  # fmt: skip


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


def test_seed_demo_onboards_the_labs_machines_over_ssh_until_they_are_offered(lab, committed, capsys):
    with committed():  # the onboarding task, then the runtime install it queues, as the worker runs them
        call_command("seed_demo", lab=lab.number)
    out = capsys.readouterr().out
    status = lab.status()
    assert f"nw-01: {status.machine('nw-01').address} behind {status.machine('nw-01').gate}" in out
    hosts = {h.name: h for h in Host.objects.select_related("provider")}
    assert {h.provider.name for h in hosts.values()} == {"Northwind GPU Cloud", "Helios Compute"}
    for name, host in hosts.items():
        assert host.state == HostState.AVAILABLE, host.error_message
        assert (host.driver, host.address, host.private_address) == (
            "ssh",
            status.machine(name).gate,
            status.machine(name).address,
        )
        assert host.ssh_host_key == status.machine(name).host_key  # pinned from the lab, not learnt
        assert host.runtime["state"] == "ready", host.runtime
    assert services.offerable_hosts().count() == 2
    # Declared as the lab shapes them (its topology's rates times its scale): predictions are about those.
    record, _ = operations.read_lab(lab.base, lab.number)
    assert hosts["nw-01"].fabric.per_host_gbytes_per_s == pytest.approx(400 * record.scale)
    assert hosts["nw-01"].site.backbone_gbytes_per_s == pytest.approx(12.5 * record.scale)

    call_command("seed_demo", lab=lab.number)  # again: nothing added twice
    assert Host.objects.count() == 2


def test_a_lab_that_is_not_up_is_refused_with_what_to_do():
    with pytest.raises(CommandError, match=r"lab 254 is not up .*run `manage.py lab up --lab 254` first"):
        call_command("seed_demo", lab=254)
