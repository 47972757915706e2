"""Volt's runtime brought to a fresh lab machine over SSH alone (issue 25 item 2): the machine has its own
/opt and no Ray. Where Volt may use sudo, it copies the runtime's image (checked by sha256), makes the venv
at /opt/volt/runtime-<key> and mounts the image read-only under it, verifies it, and only then offers the
host. A runtime that no longer matches Volt's pins is refused before a cluster, with what to do, and
installing again repairs it without copying the image again; a machine powered off and on gets its image
mounted again by the check. With the image off, the wheelhouse is copied and pip installs it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from inventory import host_runtime, runtime_build, runtimes, services
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
    image_mb = f"{runtime_build.load_image().size / 1e6:.0f} MB"
    assert f"installed by Volt from its image, {image_mb} copied" in ready_line
    # On the machine: Ray from the runtime, runnable by another user (a cluster's own), nothing of Volt,
    # and the packages on a read-only mount that no job can change.
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
    assert "ro" in lab.ssh("nw-01", f"findmnt -no OPTIONS {path}/image").strip().split(",")
    assert "Read-only file system" in lab.ssh("nw-01", f"sudo -n touch {path}/image/torch/x 2>&1 || true")

    # The runtime on the host drifts (someone put another numpy before the image's): refused before a
    # cluster, with the fix.
    lab.ssh(
        "nw-01",
        f"d=$(echo {path}/lib/python3*/site-packages)/numpy-0.0.1.dist-info && mkdir $d && "
        "printf 'Metadata-Version: 2.1\\nName: numpy\\nVersion: 0.0.1\\n' > $d/METADATA",
    )
    refused = runtimes.check_nodes([host])
    assert f"numpy 0.0.1, Volt pins {host_runtime.pins()['numpy']}" in refused[host.pk]
    assert "Install it again from the host page" in refused[host.pk]
    host.refresh_from_db()
    assert host.runtime["state"] == "failed" and not offered(host)

    # Installing again repairs it; the image already there is not copied again.
    host = runtimes.install_runtime(host.pk)
    assert host.runtime["state"] == "ready", host.runtime
    assert runtimes.check_nodes([host]) == {}
    assert offered(host)
    last = host.events.filter(message__startswith="runtime ready:").latest("pk").message
    assert "installed by Volt from its image, already on the host" in last

    # A power cycle takes the mount with it; the check before a cluster mounts the image again.
    lab.manage("power-off", "nw-01")
    lab.manage("power-on", "nw-01")
    assert "not a mountpoint" in lab.ssh("nw-01", f"mountpoint {path}/image || true")
    # Two checks at once (two clusters' bring-ups on the host) mount it once between them.
    drivers = [lab.driver("nw-01"), lab.driver("nw-01")]
    try:
        with ThreadPoolExecutor(2) as pool:
            found = list(pool.map(host_runtime.find, drivers))
    finally:
        for driver in drivers:
            driver.close()
    assert [(r.ready, r.problems) for r in found] == [(True, []), (True, [])]
    assert lab.ssh("nw-01", f"findmnt -n {path}/image | wc -l").strip() == "1"
    assert runtimes.check_nodes([host]) == {}
    assert "is a mountpoint" in lab.ssh("nw-01", f"mountpoint {path}/image")


def test_with_the_image_off_the_wheelhouse_is_copied_and_installed_by_pip(
    lab, northwind, northwind_ib, settings
):
    settings.VOLT_RUNTIME_IMAGE = False
    host = onboard_machine(lab, northwind, northwind_ib, "nw-01")
    lab.ssh("nw-01", "for m in /opt/volt/runtime-*/image; do mountpoint -q $m && sudo -n umount $m; done; "
                     "sudo -n rm -rf /opt/volt ~/.volt")  # fmt: skip

    host = runtimes.install_runtime(host.pk)

    path = f"/opt/volt/runtime-{host_runtime.key()}"
    assert host.runtime["state"] == "ready", host.runtime
    wheels = len(host_runtime.load_wheelhouse().files)
    last = host.events.filter(message__startswith="runtime ready:").latest("pk").message
    assert f"installed by Volt, {wheels} of {wheels} wheels copied" in last
    assert lab.ssh("nw-01", f"test -e {path}/image && echo image || echo none").strip() == "none"
    assert host_runtime.pins()["ray"] in lab.ssh("nw-01", f"{path}/bin/ray --version")
    assert int(lab.ssh("nw-01", f"ls ~/.volt/wheelhouse/{host_runtime.key()} | wc -l")) == wheels
