"""Fixtures for integration tests that need real services (here: an OpenSSH server on 127.0.0.1).

    def test_discovery(sshd_factory, tmp_path):
        server = sshd_factory({"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(tmp_path)})
        driver = SshDriver(server.host, server.port, server.username, server.client_private_key,
                           known_host_key=server.host_public_key)

A missing /usr/sbin/sshd fails the test (it is never skipped): install openssh-server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:  # tests/ may or may not become a package; work either way
    from .sshd import SshdServer, SshdUnavailable, start_sshd
except ImportError:
    from sshd import SshdServer, SshdUnavailable, start_sshd


@pytest.fixture
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshdServer]]:
    """A callable `(env=None) -> SshdServer`; every server it started is stopped at teardown."""
    started: list[SshdServer] = []

    def start(env: dict[str, str] | None = None, listen: str = "127.0.0.1", extra: tuple = ()) -> SshdServer:
        try:
            server = start_sshd(tmp_path_factory.mktemp("sshd"), env, listen, extra)
        except SshdUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sshd(sshd_factory: Callable[..., SshdServer]) -> SshdServer:
    """One sshd with no extra environment."""
    return sshd_factory()


@pytest.fixture(scope="session")
def store_admin(tmp_path_factory):
    """The checkpoint store as Volt's admin identity sees it: VOLT_STORE_* when set (scripts/test starts one),
    else an embedded SeaweedFS of this run's own, stopped at the end."""
    from voltweb import embedded_store, object_store

    started = None
    if os.environ.get("VOLT_STORE_ENDPOINT"):
        endpoint, key, secret = (
            os.environ[f"VOLT_STORE_{k}"] for k in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY")
        )
    else:
        started = embedded_store.start(tmp_path_factory.mktemp("store"))
        endpoint, key, secret = started.endpoint, started.access_key, started.secret_key
    yield object_store.Store(endpoint, "us-east-1", key, secret, "volt-checkpoints")
    if started is not None:
        embedded_store.stop(started.pid, started.data_dir)
        assert not os.path.exists(f"/proc/{started.pid}"), "the embedded store's process is gone"
        port = started.endpoint.rsplit(":", 1)[1]
        assert not list(Path("/tmp").glob(f"seaweedfs-s3-{port}.sock")), "its socket is removed"
