"""Two installs on one machine (two checkouts, a demo and a test run) keep out of each other's way.

The namespace comes from the data dir: Redis DB (when REDIS_URL is unset), Ray cluster ids and with
them node markers and workdirs, Ray temp folders, and where the search for a free port slot starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusters import shutdown
from clusters.provision import ray_cluster_id
from clusters.provisioning import ray_nodes
from inventory.drivers.local import LocalDriver, create_sandbox
from voltweb import namespace

REPO = Path(__file__).resolve().parents[2]


def settings_value(name: str, **env: str) -> str:
    """A setting as a fresh process computes it from the environment."""
    clean = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "VOLT_DATA_DIR")}
    code = f"import django; django.setup(); from django.conf import settings; print(settings.{name})"
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, "DJANGO_SETTINGS_MODULE": "voltweb.settings", **env},
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def test_without_redis_url_each_data_dir_gets_its_own_redis_db(tmp_path):
    first, second = tmp_path / "checkout-a" / "var", tmp_path / "checkout-b" / "var"
    url_a = settings_value("REDIS_URL", VOLT_DATA_DIR=str(first))
    url_b = settings_value("REDIS_URL", VOLT_DATA_DIR=str(second))
    assert url_a == f"redis://127.0.0.1:6379/{namespace.redis_db(first)}"
    assert url_b == f"redis://127.0.0.1:6379/{namespace.redis_db(second)}"
    assert 1 <= namespace.redis_db(first) <= 15
    assert (
        settings_value("REDIS_URL", VOLT_DATA_DIR=str(first), REDIS_URL="redis://r:6379/4")
        == "redis://r:6379/4"
    )


def test_install_ids_differ_per_data_dir_and_are_stable(tmp_path):
    ids = {namespace.install_id(tmp_path / f"install-{n}") for n in range(50)}
    assert len(ids) == 50
    assert namespace.install_id(tmp_path / "x") == namespace.install_id(str(tmp_path / "y" / ".." / "x"))
    starts = {namespace.first_slot(tmp_path / f"install-{n}") for n in range(50)}
    assert len(starts) > 1 and starts <= set(range(0, ray_nodes.MAX_SLOT + 1))


def test_ray_names_and_temp_dirs_carry_the_install(settings, tmp_path):
    cluster = SimpleNamespace(pk=1234567890)
    settings.VOLT_DATA_DIR = tmp_path / "a"
    name_a = ray_cluster_id(cluster)
    temp_a = f"{namespace.ray_temp_root(settings.VOLT_DATA_DIR)}/{cluster.pk}-{ray_nodes.MAX_SLOT}"
    settings.VOLT_DATA_DIR = tmp_path / "b"
    assert name_a != ray_cluster_id(cluster) and name_a.startswith("volt-")
    assert temp_a.startswith("/tmp/volt-ray/") and len(temp_a) <= 40  # Ray's socket paths must fit


def marked_sleeper(driver: LocalDriver, cluster_id: str) -> int:
    """A long-lived process carrying the Ray node marker of `cluster_id` on this host, as Ray's do."""
    marker = f"{ray_nodes.NODE_MARKER_VAR}={cluster_id}@{driver.address}"
    result = driver.run(
        f"export {marker}; setsid nohup sleep 120 >/dev/null 2>&1 < /dev/null & echo $!", timeout=10
    )
    return int(result.stdout.strip())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def two_installs(settings, tmp_path):
    """Install A and install B, each with a local host at the same address (both seed 127.0.0.2)."""
    drivers = {}
    for name in ("a", "b"):
        sandbox = tmp_path / name / "hosts" / "h1"
        create_sandbox(sandbox, {"gpus": []})
        drivers[name] = LocalDriver(sandbox, "127.0.0.2")
    started: list[int] = []
    yield drivers, started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stopping_a_cluster_never_touches_another_installs_cluster_of_the_same_number(
    settings, tmp_path, two_installs
):
    drivers, started = two_installs
    cluster = SimpleNamespace(pk=1)  # both installs' first cluster
    settings.VOLT_DATA_DIR = tmp_path / "b"
    theirs = marked_sleeper(drivers["b"], ray_cluster_id(cluster))
    settings.VOLT_DATA_DIR = tmp_path / "a"
    ours = marked_sleeper(drivers["a"], ray_cluster_id(cluster))
    started += [theirs, ours]

    assert ray_nodes.stop_node(drivers["a"], ray_cluster_id(cluster), grace_s=0.5) == []
    assert not alive(ours) and alive(theirs)


def test_the_demos_last_sweep_kills_only_its_own_installs_ray_processes(settings, tmp_path, two_installs):
    drivers, started = two_installs
    settings.VOLT_DATA_DIR = tmp_path / "b"
    theirs = marked_sleeper(drivers["b"], ray_cluster_id(SimpleNamespace(pk=3)))
    settings.VOLT_DATA_DIR = tmp_path / "a"
    ours = marked_sleeper(drivers["a"], ray_cluster_id(SimpleNamespace(pk=7)))
    started += [theirs, ours]
    time.sleep(0.2)

    assert shutdown.kill_leftover_nodes(wait_s=5) == [ours]
    assert not alive(ours) and alive(theirs)


def test_an_install_id_set_explicitly_names_the_install_wherever_its_data_dir_is(settings, tmp_path):
    settings.VOLT_DATA_DIR = tmp_path / "one"
    derived = namespace.current_id()
    settings.VOLT_INSTALL_ID = "prod7"

    assert derived != "prod7" and namespace.current_id() == "prod7"
    assert namespace.install_seed() == "prod7"  # the Unix users on hosts, from any machine of the install
    settings.VOLT_DATA_DIR = tmp_path / "two"
    assert namespace.current_id() == "prod7"
