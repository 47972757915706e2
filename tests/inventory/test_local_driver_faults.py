"""The `local` driver's run-time faults that act on processes rather than on nvidia-smi's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory.drivers.base import DriverError
from inventory.drivers.local import LocalDriver, clear_fault, create_sandbox, set_fault


@pytest.fixture
def host(tmp_path: Path):
    driver = LocalDriver(tmp_path / "host", "127.0.0.77")
    create_sandbox(driver.sandbox, {"gpu_model": "H100", "gpu_count": 2})
    yield driver
    clear_fault(driver.sandbox, "throttled")


def busy(driver: LocalDriver) -> None:
    """A fixed amount of CPU work (about half a second of one CPU) run through the driver."""
    result = driver.run("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done", timeout=120)
    assert result.ok, result.stderr


def cpu_cgroup(driver: LocalDriver) -> str:
    lines = driver.run("cat /proc/self/cgroup").stdout.splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] in ("cpu", "cpu,cpuacct", ""))


def group_dir(group: str) -> Path:
    v1 = Path("/sys/fs/cgroup/cpu", group.lstrip("/"))
    return v1 if v1.exists() else Path("/sys/fs/cgroup", group.lstrip("/"))


def test_a_throttled_host_runs_its_commands_in_a_capped_cpu_cgroup(host):
    assert "volt-throttle" not in cpu_cgroup(host)

    set_fault(host.sandbox, "throttled", "10")
    group = group_dir(cpu_cgroup(host))
    busy(host)

    assert group.name.startswith("volt-throttle-")
    quota = (group / "cpu.cfs_quota_us") if (group / "cpu.cfs_quota_us").exists() else (group / "cpu.max")
    assert quota.read_text().split()[0] == "10000"  # 10% of a 100 ms period
    stats = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    assert int(stats["nr_throttled"]) > 0  # the kernel really held the work back


def test_clearing_the_fault_removes_the_cgroup_and_the_cap(host):
    set_fault(host.sandbox, "throttled", "10")
    group = cpu_cgroup(host)

    clear_fault(host.sandbox, "throttled")

    assert "volt-throttle" not in cpu_cgroup(host)
    assert not group_dir(group).exists()


@pytest.mark.parametrize("content", ["fast", "0", "250"])
def test_a_throttle_that_is_no_percentage_is_refused_with_what_to_write(host, content):
    set_fault(host.sandbox, "throttled", content)

    with pytest.raises(DriverError, match="write a CPU percentage from 1 to 100"):
        host.run("true")
