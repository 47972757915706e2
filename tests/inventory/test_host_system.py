"""What a host runs (issue 25 item 2's first step): onboarding records OS, kernel, Pythons, the NVIDIA
driver and CUDA versions and whether Volt may use sudo, shows them to the host's admins, and never fails
on a host that prints none of it."""

from __future__ import annotations

import os
import re

import pytest
from django.test import Client

from inventory.discovery.system import HostSystem, parse_system
from inventory.models import Host, HostEvent

UBUNTU = """@@os
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
ID=ubuntu
ID_LIKE=debian
@@kernel
Linux 5.15.0-105-generic x86_64
@@pythons
/usr/bin/python3 3.10.12
/usr/bin/python3.10 3.10.12
/usr/local/bin/python3.11 3.11.9
/home/volt/.pyenv/shims/python3.12
@@smi
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
@@user
volt
1001
@@sudo
yes
"""


def test_a_real_hosts_facts_are_read_from_one_command():
    facts = parse_system(UBUNTU)
    assert (facts.os, facts.os_id, facts.kernel, facts.arch) == (
        "Ubuntu 22.04.4 LTS",
        "ubuntu 22.04",
        "5.15.0-105-generic",
        "x86_64",
    )
    # A pyenv shim with no interpreter behind it prints no version: not a Python.
    assert facts.pythons == (
        ("/usr/bin/python3", "3.10.12"),
        ("/usr/bin/python3.10", "3.10.12"),
        ("/usr/local/bin/python3.11", "3.11.9"),
    )
    assert (facts.driver_version, facts.cuda_version) == ("550.54.15", "12.4")
    assert (facts.user, facts.privilege) == ("volt", "sudo")
    assert facts.summary == (
        "Ubuntu 22.04.4 LTS, kernel 5.15.0-105-generic, Python 3.10.12, 3.11.9, "
        "driver 550.54.15 (CUDA 12.4), Volt may use sudo"
    )


@pytest.mark.parametrize(
    ("user", "sudo", "privilege", "words"),
    [
        ("root\n0", "no", "root", "Volt logs in as root"),
        ("volt\n1001", "no", "none", "no sudo for Volt's user"),
    ],
)
def test_root_and_no_sudo_are_told_apart(user, sudo, privilege, words):
    facts = parse_system(f"@@user\n{user}\n@@sudo\n{sudo}\n")
    assert facts.privilege == privilege and facts.summary.endswith(words)


def test_a_host_that_prints_nothing_has_empty_facts_not_an_error():
    assert parse_system("") == HostSystem()
    assert parse_system("bash: uname: command not found\n@@kernel\n") == HostSystem()
    assert HostSystem().summary == "unknown OS, no Python 3, sudo unknown"


@pytest.mark.django_db
def test_onboarding_records_the_facts_and_shows_them_to_the_hosts_admins_only(
    northwind, northwind_ib, add_local_host, priya, alice, client_for
):
    host = add_local_host(northwind, northwind_ib, "iad1-h100-01")

    system = host.system
    # The simulated nvidia-smi prints the declared driver; the rest is this machine, read for real.
    assert (system["driver_version"], system["cuda_version"]) == ("550.54.15", "12.4")
    assert system["kernel"] == os.uname().release and system["arch"] == os.uname().machine
    assert system["pythons"] and all(p["version"].startswith("3.") for p in system["pythons"])
    assert system["privilege"] == ("root" if os.geteuid() == 0 else system["privilege"])
    line = HostEvent.objects.filter(host=host, message__startswith="system: ").get().message
    assert "driver 550.54.15 (CUDA 12.4)" in line

    assert client_for(priya).get(f"/api/v1/hosts/{host.pk}/").json()["system"] == system
    assert "system" not in client_for(alice).get(f"/api/v1/hosts/{host.pk}/").json()

    page = Client()
    page.force_login(priya)
    html = page.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert 'id="host-system"' in html and "CUDA 12.4" in html and system["kernel"] in html
    # Each version once (python3 and python3.11 are one interpreter: the walk saw "3.11.7, 3.11.7"), and
    # root not said twice ("root (root)").
    shown = re.search(r'<span class="label">Python</span>(.*?)</div>', html).group(1)
    versions = re.findall(r">(3\.[0-9.]+)</span>", shown)
    assert versions == sorted(set(versions), key=versions.index) and versions
    assert "root</span> (root)" not in html
    assert "VOLT_LOCAL_FABRIC_SCALE" not in html  # the factor itself, not a setting's name
    page.force_login(alice)
    assert 'id="host-system"' not in page.get(f"/inventory/hosts/{host.pk}/").content.decode()


@pytest.mark.parametrize(
    ("privilege", "says"),
    [
        ("sudo", "a Unix user of the cluster's own, made and removed by Volt through sudo"),
        ("root", "a Unix user of the cluster's own, made and removed by Volt through root"),
        ("none", 'run as <span class="mono">ubuntu</span> (no sudo for Volt here: clusters cannot get users'),
    ],
)
def test_the_host_page_says_who_an_ssh_hosts_clusters_run_as(
    northwind, northwind_ib, add_local_host, priya, privilege, says
):
    host = add_local_host(northwind, northwind_ib, "iad1-h100-02")
    Host.objects.filter(pk=host.pk).update(
        driver="ssh", system={**host.system, "user": "ubuntu", "privilege": privilege}
    )
    page = Client()
    page.force_login(priya)
    html = page.get(f"/inventory/hosts/{host.pk}/").content.decode()
    tenancy = re.search(r'<div id="host-tenancy"[^>]*>(.*?)</div>', html).group(1)
    assert "one team at a time" in tenancy and says in tenancy


# --- private addresses (issue 25: hosts Volt reaches through a gateway) ------------------------------


def test_a_hosts_own_addresses_are_read_with_its_facts():
    facts = parse_system("@@addresses\n127.0.0.1/8\n10.77.1.11/24\n10.77.1.11/24\nfe80::1/64\n")
    assert facts.addresses == ("127.0.0.1", "10.77.1.11")
    assert facts.as_json()["addresses"] == ["127.0.0.1", "10.77.1.11"]


def test_a_private_address_the_host_does_not_have_is_refused_with_the_fix():
    from inventory.models import Host
    from inventory.onboarding import private_address_problem

    host = Host(name="nw-01", address="gw.example.net", private_address="10.77.1.12")
    problem = private_address_problem(host, ("127.0.0.1", "10.77.1.11"))
    assert problem.startswith("nw-01 has no address 10.77.1.12 (its IPv4 addresses: 10.77.1.11)")
    assert "retire this host and add it again with the private address" in problem
    assert private_address_problem(host, ("10.77.1.12",)) == ""
    assert private_address_problem(Host(name="a", address="10.0.0.5"), ()) == ""  # none declared
    assert host.node_ip == "10.77.1.12" and Host(address="10.0.0.5").node_ip == "10.0.0.5"


@pytest.mark.django_db
def test_the_api_takes_a_private_address_and_refuses_one_that_is_not_ipv4(
    northwind, northwind_ib, priya, client_for
):
    from tests.inventory.test_onboarding_rules import ssh_body

    client = client_for(priya)
    block = northwind_ib.blocks.first().pk
    bad = client.post("/api/v1/hosts/", ssh_body(block=block, private_address="10.77.1"), format="json")
    assert bad.status_code == 400 and "private_address" in bad.json()["error"]["fields"]
    made = client.post("/api/v1/hosts/", ssh_body(block=block, private_address="10.77.1.11"), format="json")
    assert made.status_code == 202, made.json()  # accepted: discovery is queued
    assert client.get(f"/api/v1/hosts/{made.json()['id']}/").json()["private_address"] == "10.77.1.11"


def test_a_host_name_is_refused_as_a_ray_node_address_before_anything_runs():
    """A DNS-named SSH host without a private address: Ray would get --node-ip-address=<name> and the
    head's node list would never match; refused at once, saying what to give instead."""
    from clusters.provisioning import ray_nodes

    class NoHost:
        address = "volt@gpu-07.example.net:22"

        def run(self, command, timeout=None):
            raise AssertionError("nothing may run on the host")

    with pytest.raises(
        ValueError, match=r"node_ip 'gpu-07.example.net' is not an IP address.*private address"
    ):
        ray_nodes.start_head(NoHost(), cluster_id="volt-x-1", ports=ray_nodes.ports_for(3),
                             temp_dir="/tmp/volt-ray/x/1-0", node_ip="gpu-07.example.net")  # fmt: skip


# --- what a cluster's overlay needs (issue 26: onboarding says whether the host can join one) ----------


@pytest.mark.parametrize(
    ("printed", "overlay", "missing"),
    [
        ("wg\nkernel\ntun\n", "kernel", ""),
        ("wg\nwireguard-go\ntun\n", "wireguard-go", ""),
        ("wireguard-go\ntun\n", "", "`wg` (install wireguard-tools)"),
        ("wg\nwireguard-go\n", "", "/dev/net/tun (wireguard-go needs it)"),
        (
            "",
            "",
            "`wg` (install wireguard-tools), kernel WireGuard or wireguard-go (install wireguard-go), "
            "/dev/net/tun (wireguard-go needs it)",
        ),
    ],
)
def test_onboarding_reads_whether_a_host_can_join_an_overlay_and_what_it_lacks(printed, overlay, missing):
    facts = parse_system(f"@@sudo\nyes\n@@wireguard\n{printed}")
    assert (facts.overlay, facts.overlay_missing) == (overlay, missing)
    assert facts.as_json()["overlay"] == overlay
    if not overlay:
        assert facts.overlay_summary == f"no overlay possible: needs {missing}"


def test_a_host_discovered_before_volt_asked_is_not_called_unable():
    facts = parse_system("@@sudo\nyes\n")
    assert (facts.overlay, facts.overlay_missing, facts.overlay_summary) == ("unknown", "", "")


def test_this_machines_own_answer_is_parsed_from_the_real_command():
    import subprocess

    from inventory.discovery.system import SYSTEM_COMMAND

    done = subprocess.run(["sh", "-c", SYSTEM_COMMAND], capture_output=True, text=True, timeout=30)
    facts = parse_system(done.stdout)
    assert done.returncode == 0 and facts.wireguard is not None
    assert facts.overlay in ("kernel", "wireguard-go", "")
    assert (facts.overlay == "") == bool(facts.overlay_missing)


@pytest.mark.django_db
def test_the_host_page_says_whether_an_ssh_host_can_join_an_overlay(
    northwind, northwind_ib, add_local_host, priya
):
    host = add_local_host(northwind, northwind_ib, "iad1-h100-03")
    lacking = "`wg` (install wireguard-tools)"
    Host.objects.filter(pk=host.pk).update(
        driver="ssh", system={**host.system, "overlay": "", "overlay_missing": lacking}
    )
    page = Client()
    page.force_login(priya)
    html = page.get(f"/inventory/hosts/{host.pk}/").content.decode()
    shown = re.search(r'<div id="host-overlay">(.*?)</div>', html).group(1)
    assert "not possible" in shown and "needs `wg` (install wireguard-tools)" in shown
    Host.objects.filter(pk=host.pk).update(system={**host.system, "overlay": "wireguard-go"})
    html = page.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert "wireguard-go (userspace WireGuard)" in re.search(
        r'<div id="host-overlay">(.*?)</div>', html
    ).group(1)
