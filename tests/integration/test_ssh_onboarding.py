"""An `ssh` host onboarded end to end: real sshd on 127.0.0.1, real asyncssh, simulated nvidia-smi.

The sshd's SetEnv puts a sandbox's bin/ (simulated nvidia-smi and ibstat printing the real formats)
first on the remote PATH, so the host looks like a GPU machine to the same discovery code.
"""

from decimal import Decimal

import pytest

from inventory import health, services
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.drivers.local import create_sandbox, set_fault
from inventory.models import GPU

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def gpu_sshd(sshd_factory, tmp_path):
    sandbox = tmp_path / "remote-host"
    create_sandbox(sandbox, services.default_local_spec("A100", 8, "ib_hdr") | {"seed": "ssh-a100"})
    return sshd_factory({"PATH": f"{sandbox}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(sandbox)}), sandbox


def add_ssh_host(provider, fabric, server, name="ssh-a100", key=None, host_key=""):
    request = services.HostRequest(
        name=name,
        block=fabric.blocks.first(),
        driver=DriverKind.SSH,
        price_per_gpu_hour=Decimal("1.45"),
        address=server.host,
        ssh_port=server.port,
        ssh_user=server.username,
        ssh_private_key=key or server.client_private_key,
        ssh_host_key=host_key,
    )
    host = services.add_host(provider, request, queue=False)
    return services.onboard_host(host.pk)


def test_ssh_host_is_onboarded_and_its_host_key_pinned(northwind, northwind_ib, gpu_sshd):
    server, _ = gpu_sshd
    host = add_ssh_host(northwind, northwind_ib, server)

    assert host.state == HostState.AVAILABLE, host.error_message
    assert (host.gpu_model, host.gpu_count, host.nvlink_domain_size) == ("A100-80GB", 8, 8)
    assert [p["rate_gbps"] for p in host.discovery["ib_ports"]] == [200] * 8
    assert host.ssh_host_key == server.host_public_key  # trust on first use, then pinned
    assert "OPENSSH PRIVATE KEY" not in host.ssh_private_key_encrypted  # encrypted at rest

    assert health.health_sweep() == {"ok": 1}  # the pinned key keeps working


def test_ssh_host_with_refused_key_fails_with_auth_error(northwind, northwind_ib, gpu_sshd):
    import asyncssh

    server, _ = gpu_sshd
    stranger = asyncssh.generate_private_key("ssh-ed25519").export_private_key("openssh").decode()
    host = add_ssh_host(northwind, northwind_ib, server, key=stranger)

    assert host.state == HostState.FAILED and host.error_code == "auth_refused"
    assert "authorized_keys" in host.error_message and not host.gpus.exists()


def test_ssh_host_presenting_another_host_key_is_refused(northwind, northwind_ib, gpu_sshd):
    import asyncssh

    server, _ = gpu_sshd
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    host = add_ssh_host(northwind, northwind_ib, server, host_key=impostor)

    assert host.state == HostState.FAILED and host.error_code == "host_key_mismatch"
    assert not host.gpus.exists()


def test_ssh_host_without_nvidia_smi_fails_clearly(northwind, northwind_ib, sshd_factory, tmp_path):
    sandbox = tmp_path / "no-driver"
    create_sandbox(sandbox, {"gpu_model": "H100", "gpu_count": 8}, {"nvidia_smi_missing": ""})
    server = sshd_factory({"PATH": f"{sandbox}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(sandbox)})
    host = add_ssh_host(northwind, northwind_ib, server, name="bare")

    assert host.state == HostState.FAILED and host.error_code == "nvidia_smi_missing"


def test_unreachable_ssh_host_fails_with_address_in_message(northwind, northwind_ib, sshd_factory):
    server = sshd_factory()
    server.stop()
    host = add_ssh_host(northwind, northwind_ib, server, name="gone")

    assert host.state == HostState.FAILED and host.error_code == "unreachable"
    assert str(server.port) in host.error_message


def sandbox_sshd(sshd_factory, sandbox):
    return sshd_factory({"PATH": f"{sandbox}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(sandbox)})


def test_ssh_host_with_one_ecc_failed_gpu_of_eight_is_onboarded_without_it(
    alice, northwind, northwind_ib, gpu_sshd
):
    server, sandbox = gpu_sshd
    set_fault(sandbox, "ecc_uncorrectable", "3")

    host = add_ssh_host(northwind, northwind_ib, server)

    assert host.state == HostState.AVAILABLE, host.error_message
    assert (host.gpu_count, host.free_gpus) == (8, 7)
    bad = host.gpus.get(index=3)
    assert bad.health == "unhealthy" and "uncorrectable ECC" in bad.health_reason
    assert 3 not in sum(host.free_gpu_map, [])
    [offer] = services.offers(services.visible_hosts(alice))
    assert (offer["gpu_model"], offer["free_gpus"], offer["total_gpus"]) == ("A100-80GB", 7, 8)


def test_ssh_host_whose_driver_is_not_loaded_says_so(northwind, northwind_ib, gpu_sshd):
    server, sandbox = gpu_sshd
    set_fault(sandbox, "driver_not_loaded")

    host = add_ssh_host(northwind, northwind_ib, server)

    assert host.state == HostState.FAILED and host.error_code == "driver_not_loaded"
    assert "couldn't communicate with the NVIDIA driver" in host.error_message
    assert "modprobe nvidia" in host.error_message


def test_ssh_host_counts_an_ethernet_port_apart_from_infiniband(
    northwind, northwind_ib, sshd_factory, tmp_path
):
    sandbox = tmp_path / "dgx"
    nics = [{"name": f"mlx5_{i}", "link_layer": "InfiniBand", "rate_gbps": 400} for i in range(8)]
    nics.append({"name": "mlx5_8", "link_layer": "Ethernet", "rate_gbps": 100, "roce": False})
    create_sandbox(sandbox, {"gpu_model": "H100", "gpu_count": 8, "nics": nics, "seed": "ssh-dgx"})
    server = sandbox_sshd(sshd_factory, sandbox)

    host = add_ssh_host(northwind, northwind_ib, server, name="ssh-dgx")

    assert host.state == HostState.AVAILABLE, host.error_message
    assert host.discovery["port_counts"] == {"infiniband": 8, "roce": 0, "ethernet": 1}
    assert host.ports.get(ca="mlx5_8").transport == "ethernet"
    assert host.discovery["network_warnings"] == []


def test_ssh_host_without_ibstat_reads_ports_from_sysfs_and_is_warned_about_slow_links(
    northwind, northwind_ib, gpu_sshd
):
    server, sandbox = gpu_sshd
    (sandbox / "bin" / "ibstat").unlink()

    host = add_ssh_host(northwind, northwind_ib, server)

    assert host.ports.count() == 8 and set(host.ports.values_list("source", flat=True)) == {"sysfs"}
    assert set(host.ports.values_list("rate_gbps", flat=True)) == {200}
    warnings = host.discovery["network_warnings"]
    assert len(warnings) == 9  # HDR ports on a fabric declared NDR, and what they give together
    assert "the ports give 200 GB/s per host (8 x 200 Gb/s InfiniBand), below the 400 GB/s" in warnings[-1]
    assert host.discovered_gbytes_per_s == 200.0
    assert host.events.filter(kind=HostEventKind.ERROR, message__contains="runs at 200 Gb/s").exists()


def test_retired_ssh_host_added_again_comes_back_with_its_gpus(northwind, northwind_ib, gpu_sshd, priya):
    server, _ = gpu_sshd
    old = add_ssh_host(northwind, northwind_ib, server, name="rack-a")
    uuids = sorted(old.gpus.values_list("uuid", flat=True))
    services.act_on_host(old, "retire", priya)

    new = add_ssh_host(northwind, northwind_ib, server, name="rack-b")

    assert new.state == HostState.AVAILABLE, new.error_message
    assert sorted(new.gpus.values_list("uuid", flat=True)) == uuids and new.free_gpus == 8
    assert not GPU.objects.filter(host=old).exists()
