"""The local hosts' Ray runtime (inventory/local_runtime.py): exactly Volt's pins, open to every user,
nothing of Volt; anything else is refused with a message that says how to rebuild it."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from clusters.provisioning import ray_nodes
from inventory import local_runtime


def fake_runtime(
    folder: Path, versions: dict, *, python: str | None = None, foreign=(), rewrite: bool = False
) -> Path:
    """A venv-shaped folder whose `bin/python` reports what it holds as the real report does."""
    (folder / "bin").mkdir(parents=True, exist_ok=rewrite)
    (folder / "lib" / "python3.11" / "site-packages").mkdir(parents=True, exist_ok=rewrite)
    report = {
        "python": python or local_runtime.python_version(),
        "versions": versions,
        "foreign": list(foreign),
    }
    script = folder / "bin" / "python"
    script.write_text(f"#!/bin/sh\necho '{json.dumps(report)}'\n")
    script.chmod(0o755)
    return folder


def test_pins_are_volts_own_installed_versions():
    pins = local_runtime.pins()
    assert set(pins) == {"ray", "torch", "numpy", "boto3"} and all(pins.values())
    assert local_runtime.default_path().name.startswith(f"runtime-ray{pins['ray']}-torch")


def test_a_runtime_without_numpy_is_reported_and_a_rebuild_installs_volts_numpy(
    settings, tmp_path, monkeypatch
):
    """torch printed "Failed to initialize NumPy" at the top of every job's log: the runtime held only Ray
    and torch. Volt's numpy is pinned now: a runtime built before is a mismatch that says how to rebuild,
    and `manage.py local_runtime --rebuild` installs numpy at Volt's version."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    pins = local_runtime.pins()
    runtime = fake_runtime(
        tmp_path / "rt", {"ray": pins["ray"], "torch": pins["torch"], "numpy": None, "boto3": pins["boto3"]}
    )
    monkeypatch.setattr(local_runtime, "open_to_others", lambda python: True)
    settings.VOLT_LOCAL_RUNTIME = str(runtime)
    status = local_runtime.check()
    assert status.problems == [f"numpy missing, Volt pins {pins['numpy']}"]
    with pytest.raises(local_runtime.RuntimeMismatch, match=r"numpy missing.*--rebuild"):
        local_runtime.python_for_local_hosts()
    with pytest.raises(CommandError, match="numpy missing"):
        call_command("local_runtime", "--check")

    installed: list[str] = []

    def run(command):  # venv and pip, as a fake: the venv reports what pip was asked to install
        if command[1:3] == ["-m", "venv"]:
            fake_runtime(Path(command[3]), {})
            (Path(command[3]) / "pyvenv.cfg").write_text(f"command = python -m venv {command[3]}\n")
        else:
            installed.extend(command[command.index("--no-input") + 1 :])
            versions = dict(re.fullmatch(r"([a-z0-9]+)(?:\[\w+\])?==(.+)", r).groups() for r in installed)
            fake_runtime(Path(command[0]).parents[1], {**versions, "torch": pins["torch"]}, rewrite=True)

    monkeypatch.setattr(local_runtime, "_run", run)
    monkeypatch.setattr(local_runtime, "base_interpreter", lambda: Path("/usr/bin/python3"))
    out = io.StringIO()
    call_command("local_runtime", "--rebuild", stdout=out)
    assert f"numpy=={pins['numpy']}" in installed
    assert local_runtime.check().ready and local_runtime.check().versions["numpy"] == pins["numpy"]
    assert re.search(r"\(built in \d+ s\)$", out.getvalue().strip())

    # A ready runtime says so in one line: no stray "(0 s)" line after it (the walk's slip).
    again = io.StringIO()
    call_command("local_runtime", stdout=again)
    assert again.getvalue().strip().splitlines() == [
        f"local runtime {runtime}: {local_runtime.describe(local_runtime.check())} (ready)"
    ]


def test_missing_default_runtime_falls_back_to_volts_own_python(settings, tmp_path):
    settings.VOLT_LOCAL_RUNTIME = ""
    missing = tmp_path / "none"
    assert local_runtime.check(missing).exists is False
    settings.VOLT_LOCAL_RUNTIME = str(missing)  # named but missing: refused, with the command to build it
    with pytest.raises(local_runtime.RuntimeMismatch, match="manage.py local_runtime"):
        local_runtime.python_for_local_hosts()


def test_a_runtime_that_does_not_match_volts_pins_is_refused_with_how_to_rebuild(settings, tmp_path):
    wrong = dict(local_runtime.pins(), ray="2.59.0")
    runtime = fake_runtime(tmp_path / "rt", wrong, foreign=["django"])
    settings.VOLT_LOCAL_RUNTIME = str(runtime)
    status = local_runtime.check()
    assert status.exists and not status.ready
    problems = " | ".join(status.problems)
    assert f"ray 2.59.0, Volt pins {local_runtime.pins()['ray']}" in problems
    assert "django" in problems
    with pytest.raises(local_runtime.RuntimeMismatch, match=r"--rebuild"):
        local_runtime.python_for_local_hosts()
    with pytest.raises(local_runtime.RuntimeMismatch):  # build() keeps a mismatching one unless asked
        local_runtime.build()


def test_a_matching_runtime_closed_to_others_is_refused(settings, tmp_path):
    runtime = fake_runtime(tmp_path / "rt", local_runtime.pins())
    os.chmod(tmp_path, 0o700)
    settings.VOLT_LOCAL_RUNTIME = str(runtime)
    assert any("other Unix users cannot run" in p for p in local_runtime.check().problems)


def test_a_matching_open_runtime_is_used(settings, tmp_path, monkeypatch):
    runtime = fake_runtime(tmp_path / "rt", local_runtime.pins())
    monkeypatch.setattr(local_runtime, "open_to_others", lambda python: True)
    settings.VOLT_LOCAL_RUNTIME = str(runtime)
    assert local_runtime.python_for_local_hosts() == str(runtime / "bin" / "python")
    assert local_runtime.uses_runtime()


def test_open_to_others_follows_the_link_to_the_interpreter(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    interpreter = closed / "python3"
    interpreter.write_text("")
    interpreter.chmod(0o755)
    venv = tmp_path / "venv"
    venv.mkdir(mode=0o755)
    (venv / "python").symlink_to(interpreter)
    os.chmod(tmp_path, 0o755)
    assert local_runtime.open_to_others(interpreter) is False
    assert local_runtime.open_to_others(venv / "python") is False


def test_a_node_puts_its_python_first_on_path():
    launcher = ray_nodes.launcher("/tmp/volt-ray/x/1-0", None, {}, "/opt/volt/rt/bin/python")
    assert '"PATH=/opt/volt/rt/bin:$PATH"' in launcher
    plain = ray_nodes.launcher("/tmp/volt-ray/x/1-0", None, {}, "python3")
    assert '${PATH+"PATH=$PATH"}' in plain
