"""Fixtures for integration tests that need real services (here: an OpenSSH server on 127.0.0.1).

    def test_discovery(sshd_factory, tmp_path):
        server = sshd_factory({"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "VOLT_HOST_ROOT": str(tmp_path)})
        driver = SshDriver(server.host, server.port, server.username, server.client_private_key,
                           known_host_key=server.host_public_key)

A missing /usr/sbin/sshd fails the test (it is never skipped): install openssh-server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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
