"""Volt's runtime brought to a fresh lab machine over SSH alone (issue 25 item 2): the machine has its own
/opt and no Ray; Volt copies its wheelhouse (checked by sha256), makes the venv at /opt/volt/runtime-<key>
with sudo, verifies it, and only then offers the host. A runtime that no longer matches Volt's pins is
refused before a cluster, with what to do, and installing again repairs it without copying the wheels
again."""

from __future__ import annotations

import pytest

from inventory import host_runtime, runtimes, services
from inventory.choices import HostState
from inventory.models import Host
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
            "gpu_count": 2,
        },
    ],
}


@pytest.fixture(scope="module")
def lab(make_lab):
    return make_lab(TOPOLOGY)


def offered(host: Host) -> bool:
    return services.offerable_hosts().filter(pk=host.pk).exists()


def test_a_fresh_machine_gets_volts_runtime_over_ssh_and_a_stale_one_is_refused_then_repaired(
    lab, northwind, northwind_ib
):
    host = onboard_machine(lab, northwind, northwind_ib, "nw-01")
    assert host.state == HostState.AVAILABLE, host.error_message
    assert host.system["privilege"] == "sudo"
    assert lab.ssh("nw-01", "test -e /opt/volt && echo present || echo absent").strip() == "absent"
    assert not offered(host)  # no runtime yet: not offered

    host = runtimes.install_runtime(host.pk)

    path = f"/opt/volt/runtime-{host_runtime.key()}"
    assert host.runtime["state"] == "ready", host.runtime
    assert (host.runtime["path"], host.runtime["installed_by"]) == (path, "volt")
    assert host.runtime["versions"] == host_runtime.pins()
    assert offered(host)
    ready_line = host.events.filter(message__startswith="runtime ready:").get().message
    assert f"ray {host_runtime.pins()['ray']}" in ready_line
    assert f"installed by Volt, {len(host_runtime.load_wheelhouse().files)} of" in ready_line
    # On the machine: Ray from the runtime, runnable by another user (a cluster's own), nothing of Volt.
    assert host_runtime.pins()["ray"] in lab.ssh("nw-01", f"{path}/bin/ray --version")
    assert (
        lab.ssh(
            "nw-01", f"sudo -n -u nobody {path}/bin/python -c 'import torch, numpy; print(\"ok\")'"
        ).strip()
        == "ok"
    )
    assert "MissingDjango" in lab.ssh(
        "nw-01", f"{path}/bin/python -c 'import django' 2>/dev/null && echo FoundDjango || echo MissingDjango"
    )
    wheels = lab.ssh("nw-01", f"ls ~/.volt/wheelhouse/{host_runtime.key()} | wc -l").strip()
    assert int(wheels) == len(host_runtime.load_wheelhouse().files)

    # The runtime on the host drifts (someone changed a package): refused before a cluster, with the fix.
    lab.ssh(
        "nw-01",
        f"sudo -n sed -i 's/^Version: .*/Version: 0.0.1/' {path}/lib/python3*/site-packages/numpy-*.dist-info/METADATA",
    )
    refused = runtimes.check_nodes([host])
    assert f"numpy 0.0.1, Volt pins {host_runtime.pins()['numpy']}" in refused[host.pk]
    assert "Install it again from the host page" in refused[host.pk]
    host.refresh_from_db()
    assert host.runtime["state"] == "failed" and not offered(host)

    # Installing again repairs it; the wheels already there are not copied again.
    host = runtimes.install_runtime(host.pk)
    assert host.runtime["state"] == "ready", host.runtime
    assert runtimes.check_nodes([host]) == {}
    assert offered(host)
    last = host.events.filter(message__startswith="runtime ready:").latest("pk").message
    assert f"installed by Volt, 0 of {int(wheels)} wheels copied" in last
