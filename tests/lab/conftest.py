"""The lab suite (marker `lab`; root only, as CI runs it): a lab of a few machines per module.

`lab_factory(topology=None, machines=2)` brings a lab up with `manage.py lab up` (what a user runs) under
a lab number of the test run's own, and takes it down at the end of the module whatever happened. Lab
numbers 200-253 are for tests: each module holds a flock on the number it took, so two test runs on one
box never share a lab. Not root: the suite is skipped, saying why (the one allowed skip).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

from inventory import reachability, services
from inventory.choices import DriverKind
from inventory.drivers.ssh import SshDriver
from inventory.lab import operations, state

REPO = Path(__file__).resolve().parents[2]
TEST_LABS = range(200, 254)
NOT_ROOT = (
    "the lab suite makes network, mount and PID namespaces and links: it runs as root "
    "(as scripts/test does in CI); run it with sudo"
)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/lab/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.lab)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason=NOT_ROOT))


class Lab:
    """One lab of the test run: its number, its base folder and the `manage.py lab` that drives it."""

    def __init__(self, number: int, base: Path):
        self.number = number
        self.base = base

    def manage(self, *args: str, check: bool = True, timeout_s: float = 180) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "manage.py", "lab", *args, "--lab", str(self.number)],
            cwd=REPO, env=lab_env(self.base), capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if check and result.returncode != 0:
            pytest.fail(f"manage.py lab {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def popen_up(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "manage.py", "lab", "up", *args, "--lab", str(self.number)],
            cwd=REPO, env=lab_env(self.base), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    @property
    def directory(self) -> Path:
        return state.lab_dir(self.base, self.number)

    def status(self) -> operations.LabStatus:
        return operations.status(self.base, self.number)

    def driver(self, name: str, host_key: str | None = None) -> SshDriver:
        """Volt's own SSH driver, through `name`'s gate, pinned to `host_key` (default: the machine's)."""
        status = self.status()
        machine = status.machine(name)
        return SshDriver(
            host=machine.gate,
            port=machine.gate_port,
            username=status.login_user,
            private_key=status.key_path.read_text(),
            known_host_key=host_key or machine.host_key,
            connect_timeout=10,
            command_timeout=60,
        )

    def ssh(self, name: str, command: str) -> str:
        driver = self.driver(name)
        try:
            result = driver.run(command)
        finally:
            driver.close()
        assert result.ok, f"{command!r} on {name}: {result}"
        return result.stdout

    def exec(self, name: str, *argv: str) -> subprocess.CompletedProcess:
        return operations.run_in(self.base, self.number, name, list(argv))


def lab_env(base: Path) -> dict[str, str]:
    return dict(os.environ, DJANGO_SETTINGS_MODULE="voltweb.settings_test", VOLT_LAB_DIR=str(base))


def claim_lab_number() -> tuple[int, object]:
    """A test lab number no other test run holds (its flock stays held until the handle is closed)."""
    for number in TEST_LABS:
        handle = open(f"/tmp/volt-lab-test-{number}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return number, handle
    pytest.fail(f"every test lab number ({TEST_LABS.start}-{TEST_LABS.stop - 1}) is taken")


@pytest.fixture(scope="session")
def runtime_build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runtime-build")


@pytest.fixture(autouse=True)
def _shared_runtime_build(settings, runtime_build_dir):
    """Volt's runtime (its wheelhouse and image) is built once for the lab suite, as one install's workers
    share it, not once per test's data folder."""
    settings.VOLT_RUNTIME_BUILD_DIR = str(runtime_build_dir)


@pytest.fixture(scope="module")
def lab_number() -> Iterator[int]:
    number, handle = claim_lab_number()
    yield number
    handle.close()


@pytest.fixture(scope="module")
def lab_base() -> Path:
    return Path(settings.VOLT_LAB_DIR)


@pytest.fixture(scope="module")
def make_lab(lab_number, lab_base, tmp_path_factory) -> Iterator:
    """`make_lab(topology: dict | None, *up_args) -> Lab`, up; down at the end of the module."""
    lab = Lab(lab_number, lab_base)

    def up(topology: dict | None = None, *args: str) -> Lab:
        if (lab.directory / "state.json").exists():  # a killed run's lab: this run holds its number's lock
            lab.manage("down", check=False)
        if topology is not None:
            path = tmp_path_factory.mktemp("topology") / "lab.json"
            path.write_text(json.dumps(topology))
            args = ("--topology", str(path), *args)
        lab.manage("up", *args)
        return lab

    yield up
    lab.manage("down", check=False)


def onboard_machine(lab: Lab, provider, fabric, name: str, block=None):
    """What a provider admin does for a real machine: its address, port, user and key (the host key is
    learnt on first use), and its private address, where its provider's other machines reach it (Volt
    reaches it through the lab's gate), and the UDP port its provider forwards to it, if any. Then which of its
    provider's hosts reach it, as the check onboarding queues does (a test's transaction never commits)."""
    status = lab.status()
    machine = status.machine(name)
    _record, topology = operations.read_lab(lab.base, lab.number)
    request = services.HostRequest(
        name=name,
        block=block or fabric.blocks.first(),
        private_address=machine.address,
        overlay_endpoint=topology.machine(name).udp_endpoint,
        driver=DriverKind.SSH,
        price_per_gpu_hour=Decimal("2.10"),
        address=machine.gate,
        ssh_port=machine.gate_port,
        ssh_user=status.login_user,
        ssh_private_key=status.key_path.read_text(),
    )
    host = services.add_host(provider, request, queue=False)
    host = services.onboard_host(host.pk)
    reachability.check(host)
    return host
