"""What control machines (`"role": "control"`) are given: the control plane's services through the lab's gate,
and a worker environment that is the same install as the control plane's (pure functions; the lab suite,
tests/lab/test_workers.py, runs the real thing)."""

from __future__ import annotations

import pytest

from inventory.lab import operations
from inventory.lab.topology import CONTROL_ADDRESS


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


def test_a_worker_reaches_the_same_database_and_redis_through_the_gate_as_the_same_install():
    environ = {
        "DATABASE_URL": "postgres://volt:secret@localhost:5432/volt",
        "REDIS_URL": "redis://:pw@127.0.0.1:6379/3",
        "SECRET_KEY": "k" * 50,
        "VOLT_SSH_SHARED_DIR": "/mnt/volt-shared",
        "VOLT_DATA_DIR": "/srv/volt",
        "VOLT_LAB_DIR": "/var/lib/volt-lab",
        "HOME": "/home/someone",
        "AWS_SECRET_ACCESS_KEY": "not Volt's",
    }

    env = operations.worker_environment(environ, "abc123")

    assert env["DATABASE_URL"] == f"postgres://volt:secret@{CONTROL_ADDRESS}:5432/volt"
    assert env["REDIS_URL"] == f"redis://:pw@{CONTROL_ADDRESS}:6379/3"
    assert env["VOLT_INSTALL_ID"] == "abc123" and env["SECRET_KEY"] == "k" * 50
    assert env["VOLT_SSH_SHARED_DIR"] == "/mnt/volt-shared"
    assert env["VOLT_DATA_DIR"] == operations.CONTROL_DATA_DIR  # the install is read-only there
    assert "VOLT_LAB_DIR" not in env and "AWS_SECRET_ACCESS_KEY" not in env and env["HOME"] == "/root"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"REDIS_URL": "redis://127.0.0.1:6379/1"}, "needs the control plane's PostgreSQL: set DATABASE_URL"),
        ({"DATABASE_URL": "postgres://volt@127.0.0.1/volt"}, "needs REDIS_URL"),
    ],
)
def test_a_worker_without_shared_services_is_refused_saying_what_to_set(environ, message):
    with pytest.raises(operations.LabError, match=message):
        operations.worker_environment(environ, "abc123")
