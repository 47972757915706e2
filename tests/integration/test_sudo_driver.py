"""Volt's commands on an SSH host whose login user has passwordless sudo run as root through `SudoDriver`
(what starting Ray as the cluster's own user needs), with the login's home as `~`; copies land in place
as root's, and a host that took the sudo right back is told apart from a failing command. The cluster's
user gets the same uid on every host (they share one storage folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clusters.models import Cluster
from clusters.provisioning import node_users
from clusters.provisioning.nodes import prepare_host
from clusters.tenancy import ray_cluster_id
from inventory.drivers.base import DriverError
from inventory.drivers.local import LocalDriver, create_sandbox
from inventory.drivers.sudo import SudoDriver
from tests.integration.test_node_users import UnprivilegedDriver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="sudo and Unix users need root (CI runs as root)"),
]


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    folder = tmp_path / "host"
    create_sandbox(folder, {"gpus": [{"model": "H100"}]})
    return folder


def test_commands_run_as_root_in_the_logins_home(sandbox):
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    result = driver.run("id -u; echo ~")
    assert result.ok, result
    assert result.stdout.split() == ["0", str(sandbox / "home")]
    assert driver.address == "127.0.0.250"


def test_a_copy_lands_in_place_as_roots_private_file_and_the_upload_is_gone(sandbox, tmp_path):
    source = tmp_path / "token"
    source.write_text("secret")
    source.chmod(0o644)
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    driver.run("mkdir -p ~/work && chmod 700 ~/work")

    driver.copy_file(source, "work/token")

    placed = sandbox / "home" / "work" / "token"
    assert placed.read_text() == "secret"
    assert (placed.stat().st_uid, placed.stat().st_mode & 0o777) == (0, 0o600)
    assert list((sandbox / "home" / ".volt-uploads").iterdir()) == []


def test_a_copy_that_cannot_be_put_in_place_says_where_and_leaves_no_upload(sandbox, tmp_path):
    source = tmp_path / "token"
    source.write_text("secret")
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    with pytest.raises(DriverError, match="could not put missing/folder/token in place on 127.0.0.250"):
        driver.copy_file(source, "missing/folder/token")
    assert list((sandbox / "home" / ".volt-uploads").iterdir()) == []


def test_a_login_without_passwordless_sudo_is_told_apart_from_a_failing_command(sandbox):
    sandbox.chmod(0o755)
    driver = SudoDriver(UnprivilegedDriver(sandbox, "127.0.0.250"))
    with pytest.raises(DriverError, match="no longer lets Volt's user use sudo without a password"):
        driver.run("true")


def test_the_clusters_user_gets_the_uid_asked_for_and_a_taken_uid_is_refused(sandbox, tmp_path):
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    name = node_users.user_name(987656, str(tmp_path))
    squatter = node_users.user_name(987657, str(tmp_path))
    uid = 1_999_987_656
    try:
        assert node_users.ensure_user(driver, name, uid=uid)
        assert node_users.ensure_user(driver, name, uid=uid)  # idempotent
        ids = subprocess.run(["id", name], capture_output=True, text=True).stdout
        assert f"uid={uid}({name}) gid={uid}({name})" in ids
        with pytest.raises(node_users.UserSetupFailed, match=f"uid {uid} already belongs to {name}"):
            node_users.ensure_user(driver, squatter, uid=uid)
        with pytest.raises(node_users.UserSetupFailed, match=f"has uid {uid}, not {uid + 1}"):
            node_users.ensure_user(driver, name, uid=uid + 1)
    finally:
        for user in (name, squatter):
            subprocess.run(["userdel", "-f", user], capture_output=True)
            subprocess.run(["groupdel", user], capture_output=True)


def test_a_link_planted_where_a_clusters_storage_goes_is_refused_not_followed(sandbox, tmp_path, settings):
    """The shared folder is writable by all (the lab's is 1777): a job of one cluster plants a link where the
    next cluster's storage folder will be, to have root chmod and chown what it points at."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    settings.VOLT_SSH_SHARED_DIR = str(shared)
    target = tmp_path / "precious"
    target.mkdir(mode=0o755)
    cluster = Cluster(pk=424242, ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE volt-cluster-424242")
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    planted = shared / ray_cluster_id(cluster)

    planted.symlink_to(target)
    with pytest.raises(DriverError, match="is a link or another user made it: refusing it"):
        prepare_host(driver, cluster)
    planted.unlink()
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # a folder of another user's, made in its place
    with pytest.raises(DriverError, match="is a link or another user made it: refusing it"):
        prepare_host(driver, cluster)
    assert (target.stat().st_mode & 0o777, target.stat().st_uid) == (0o755, 0)

    planted.rmdir()
    prepare_host(driver, cluster)  # the folder Volt makes itself: private, linked from the workdir
    assert planted.stat().st_mode & 0o777 == 0o700
    link = sandbox / "home" / "volt" / "clusters" / ray_cluster_id(cluster) / "storage"
    assert link.resolve() == planted


def test_the_key_forwards_to_its_heads_dashboard_alone_and_one_line_follows_a_moved_head(sandbox, settings):
    settings.VOLT_SSH_SHARED_DIR = ""
    cluster = Cluster(pk=424243, ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF volt-cluster-424243")
    keys = sandbox / "home" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(exist_ok=True)
    keys.write_text("ssh-ed25519 AAAAothers volt-login\n")
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))

    prepare_host(driver, cluster, dashboard="10.77.1.11:8265")
    prepare_host(driver, cluster, dashboard="10.77.1.11:8265")  # idempotent
    prepare_host(driver, cluster, dashboard="10.77.1.12:8365")  # recovery moved the head

    lines = keys.read_text().splitlines()
    assert lines == [
        "ssh-ed25519 AAAAothers volt-login",
        'restrict,port-forwarding,command="/bin/false",permitopen="10.77.1.12:8365" '
        + cluster.ssh_public_key,
    ]


def test_a_storage_folder_the_clusters_user_owns_is_taken_as_it_is_and_anothers_is_refused(
    sandbox, tmp_path, settings
):
    """Root changes only a folder that is root's: the cluster's user could swap its own folder for a link
    between a check and a chmod (nobody stands in for the cluster's user)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    settings.VOLT_SSH_SHARED_DIR = str(shared)
    cluster = Cluster(pk=424244, ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG volt-cluster-424244")
    driver = SudoDriver(LocalDriver(sandbox, "127.0.0.250"))
    folder = shared / ray_cluster_id(cluster)

    prepare_host(driver, cluster, run_as="nobody")  # made by root, then handed over
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (65534, 0o700)
    folder.chmod(0o755)  # the user's own business
    prepare_host(driver, cluster, run_as="nobody")
    assert folder.stat().st_mode & 0o777 == 0o755  # not touched again

    os.chown(folder, 65533, 65533)
    with pytest.raises(DriverError, match="another user made it"):
        prepare_host(driver, cluster, run_as="nobody")


def test_racing_key_changes_never_lose_the_logins_own_key(sandbox):
    """Two clusters' bring-ups and teardowns on one host at once: each rewrites authorized_keys; Volt's own
    login key (the provider's too) must survive every interleaving."""
    from concurrent.futures import ThreadPoolExecutor

    from clusters.tenancy import authorized_keys_script

    keys = sandbox / "home" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(exist_ok=True)
    keys.write_text("ssh-ed25519 AAAAlogin volt-login\n")
    clusters = [f"ssh-ed25519 AAAAcluster{n} volt-cluster-{n}" for n in range(4)]

    def churn(n: int) -> None:
        driver = LocalDriver(sandbox, "127.0.0.250")
        for _ in range(15):
            assert driver.run(authorized_keys_script(clusters[n], f"restrict {clusters[n]}")).ok
            assert driver.run(authorized_keys_script(clusters[n])).ok

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(churn, range(4)))
    assert keys.read_text() == "ssh-ed25519 AAAAlogin volt-login\n"
