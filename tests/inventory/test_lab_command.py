"""`manage.py lab` as a user without root meets it: it says what to do, and makes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inventory.lab import network


@pytest.mark.parametrize("action", [["up", "--machines", "2"], ["down"], ["power-off", "nw-01"]])
def test_lab_commands_say_to_run_them_as_root(monkeypatch, settings, action):
    settings.VOLT_LAB_DIR = base = Path("/var/lib/volt-lab-test-not-root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    with pytest.raises(CommandError, match=r"needs root: run it as root, e\.g\. `sudo "):
        call_command("lab", *action, "--lab", "254")

    assert not base.exists() and network.namespaces(254) == []


def test_a_topology_file_that_is_not_json_is_refused(settings, tmp_path):
    settings.VOLT_LAB_DIR = tmp_path / "labs"
    bad = tmp_path / "lab.json"
    bad.write_text("machines: 3")

    with pytest.raises(CommandError, match=r"cannot read the topology .*lab\.json"):
        call_command("lab", "up", "--topology", str(bad), "--lab", "254")


def test_a_lab_folder_where_machines_mount_their_own_is_refused(settings, tmp_path):
    settings.VOLT_LAB_DIR = tmp_path / "labs"  # pytest's folders are under /tmp

    with pytest.raises(CommandError, match=r"under /tmp, which every machine mounts its own over"):
        call_command("lab", "up", "--machines", "1", "--lab", "254")
