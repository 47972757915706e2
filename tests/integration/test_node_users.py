"""A cluster's own Unix user on a local host: created as root, refused politely when not root, and removed
with whatever still runs as it (no Ray needed: plain processes stand in for a job that escaped)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from clusters.provisioning import node_users
from inventory.drivers.base import CommandResult
from inventory.drivers.local import LocalDriver, create_sandbox

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating Unix users needs root (CI runs as root)"),
]


class UnprivilegedDriver(LocalDriver):
    """The same sandbox, its commands run as `nobody`: a host where Volt is not root."""

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        wrapped = f"exec setpriv --reuid=65534 --regid=65534 --clear-groups -- bash -c {_quote(command)}"
        return super().run(wrapped, timeout)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture
def driver(tmp_path: Path) -> LocalDriver:
    sandbox = tmp_path / "host"
    create_sandbox(sandbox, {"gpus": [{"model": "H100"}]})
    return LocalDriver(sandbox, "127.0.0.250")


def exists(name: str) -> bool:
    return subprocess.run(["id", "-u", name], capture_output=True).returncode == 0


def test_user_is_created_and_removed_with_an_escaped_process_and_its_files(driver, tmp_path):
    name = node_users.user_name(987654, str(tmp_path))
    temp_dir, storage = tmp_path / "temp", tmp_path / "storage"
    try:
        assert node_users.ensure_user(driver, name) and node_users.ensure_user(driver, name)  # idempotent
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)
        assert uid != 0
        for folder in (temp_dir, storage):
            folder.mkdir()
            os.chown(folder, uid, uid)
        # A "job" that left its node's session and environment marker behind: only its uid names it.
        escaped = subprocess.Popen(
            ["setpriv", f"--reuid={name}", f"--regid={name}", "--clear-groups", "--", "sleep", "300"],
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        time.sleep(0.2)

        node_users.remove_user(driver, name, remove_dirs=[str(temp_dir)], disown_dirs=[str(storage)])

        assert escaped.wait(timeout=10) == -9
        assert not exists(name)
        assert not temp_dir.exists() and storage.stat().st_uid == 0
        node_users.remove_user(driver, name)  # idempotent
    finally:
        subprocess.run(["userdel", "-f", name], capture_output=True)


def test_not_root_means_no_user_and_ray_runs_as_the_hosts_own_user(tmp_path):
    sandbox = tmp_path / "host"
    create_sandbox(sandbox, {"gpus": [{"model": "H100"}]})
    sandbox.chmod(0o755)
    for parent in (sandbox / "home", tmp_path):
        parent.chmod(0o777)
    name = node_users.user_name(987655, str(tmp_path))

    assert node_users.ensure_user(UnprivilegedDriver(sandbox, "127.0.0.250"), name) is False
    assert not exists(name)
