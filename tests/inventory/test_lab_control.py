"""What control machines (`"role": "control"`) are given: the control plane's services through the lab's gate,
and a worker environment that is the same install as the control plane's (pure functions over a lab's state
file; the lab suite, tests/lab/test_workers.py, runs the real thing)."""

from __future__ import annotations

import pytest

from inventory.lab import operations, state
from inventory.lab.topology import CONTROL_ADDRESS, as_json, build, default_topology

SERVICES = {f"{CONTROL_ADDRESS}:5432": "127.0.0.1:5432", f"{CONTROL_ADDRESS}:6379": "127.0.0.1:6379"}


@pytest.fixture
def lab_base(tmp_path):
    """A lab's state file as `lab up` leaves it: one provider machine, one control machine, the routes."""
    declared = default_topology(2, providers=1)
    declared["machines"][1]["role"] = "control"
    record = state.LabState(lab=7, topology=as_json(build(7, declared)), services=dict(SERVICES))
    record.machines = {m["name"]: state.MachineState() for m in declared["machines"]}
    state.write(state.lab_dir(tmp_path, 7), record)
    return tmp_path


def test_loopback_postgresql_and_redis_are_offered_to_control_machines_on_the_same_ports():
    database = {"ENGINE": "django.db.backends.postgresql", "HOST": "127.0.0.1", "PORT": 5433}

    services = operations.control_services(database, "redis://127.0.0.1:6380/4")

    assert services == {
        f"{CONTROL_ADDRESS}:5433": "127.0.0.1:5433",
        f"{CONTROL_ADDRESS}:6380": "127.0.0.1:6380",
    }


def test_services_the_gate_cannot_carry_are_not_offered():
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/var/lib/volt/volt.sqlite3"}
    elsewhere = {"ENGINE": "django.db.backends.postgresql", "HOST": "db.example.com", "PORT": 5432}

    assert operations.control_services(sqlite, "unix:///run/redis.sock") == {}
    assert operations.control_services(elsewhere, "redis://cache.example.com:6379/0") == {}
    assert operations.control_services(elsewhere, "redis://127.example.com:6379/0") == {}


def test_a_loopback_checkpoint_store_is_offered_to_every_machine_and_others_are_not():
    route, endpoint = operations.store_service("http://127.0.0.1:8333")
    assert route == {f"{CONTROL_ADDRESS}:8333": "127.0.0.1:8333"}
    assert endpoint == f"http://{CONTROL_ADDRESS}:8333"  # what Volt gives the lab's jobs
    assert operations.store_service("http://localhost:9000")[0] == {
        f"{CONTROL_ADDRESS}:9000": "127.0.0.1:9000"
    }
    for elsewhere in ("", "https://s3.example.com", "http://store.example.com:8333", "http://127.0.0.1"):
        assert operations.store_service(elsewhere) == ({}, ""), elsewhere


ENVIRON = {
    "DATABASE_URL": "postgres://volt:s3cr@t@localhost/volt",
    "REDIS_URL": "redis://:pw@127.0.0.1:6379/3",
    "CELERY_TASK_TIME_LIMIT": "400",
    "SECRET_KEY": "k" * 50,
    "VOLT_INSTALL_ID": "abc123",
    "VOLT_SSH_SHARED_DIR": "/mnt/volt-shared",
    "VOLT_DATA_DIR": "/srv/volt",
    "VOLT_LAB_DIR": "/var/lib/volt-lab",
    "VOLT_STORE_ENDPOINT": "http://127.0.0.1:8333",
    "VOLT_STORE_SECRET_KEY": "store",
    "HOME": "/home/someone",
    "AWS_SECRET_ACCESS_KEY": "not Volt's",
}


def test_a_worker_reaches_the_same_database_and_redis_through_the_gate_as_the_same_install(lab_base):
    env = operations.worker_environment(lab_base, 7, dict(ENVIRON))

    assert env["DATABASE_URL"] == f"postgres://volt:s3cr@t@{CONTROL_ADDRESS}:5432/volt"  # default port kept
    assert env["REDIS_URL"] == f"redis://:pw@{CONTROL_ADDRESS}:6379/3"
    assert env["VOLT_INSTALL_ID"] == "abc123" and env["SECRET_KEY"] == "k" * 50
    assert env["VOLT_SSH_SHARED_DIR"] == "/mnt/volt-shared" and env["CELERY_TASK_TIME_LIMIT"] == "400"
    assert env["VOLT_DATA_DIR"] == operations.CONTROL_DATA_DIR  # the install is read-only there
    assert env["HOME"] == "/root"
    for name in ("VOLT_LAB_DIR", "AWS_SECRET_ACCESS_KEY", "VOLT_STORE_ENDPOINT", "VOLT_STORE_SECRET_KEY"):
        assert name not in env


def test_the_worker_command_line_holds_no_secret(lab_base, monkeypatch):
    monkeypatch.setattr(operations, "command_in", lambda base, lab, name, argv, user=None: ["nsenter", *argv])

    command = operations.worker_command(lab_base, 7, "nw-02", ["-Q", "placement"])

    line = " ".join(command)
    assert "celery" in line and "-A voltweb worker -Q placement" in line
    assert "k" * 50 not in line and "s3cr@t" not in line and "pw@" not in line
    with pytest.raises(operations.LabError, match="nw-01 is not a control machine"):
        operations.worker_command(lab_base, 7, "nw-01", [])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"DATABASE_URL": ""}, "needs the control plane's PostgreSQL: set DATABASE_URL"),
        ({"REDIS_URL": ""}, "needs REDIS_URL"),
        ({"VOLT_INSTALL_ID": ""}, "set VOLT_INSTALL_ID .* for the whole install"),
        (
            {"DATABASE_URL": "postgres://volt@db.example.com/volt"},
            "carries only this box's loopback TCP services",
        ),
        ({"REDIS_URL": "redis://[::1]:6379/0"}, "carries only this box's loopback TCP services"),
        ({"REDIS_URL": "redis://127.0.0.1:6390/0"}, "port 6390 has no route to control machines"),
    ],
)
def test_a_worker_the_lab_cannot_serve_is_refused_saying_what_to_set(lab_base, change, message):
    with pytest.raises(operations.LabError, match=message):
        operations.worker_environment(lab_base, 7, dict(ENVIRON, **change))
