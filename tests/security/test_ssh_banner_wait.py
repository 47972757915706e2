"""Issue 21 point 3f: a port that accepts TCP and never sends an SSH banner is given up on quickly.

Onboarding waited for the banner as long as the whole driver timeout (VOLT_DRIVER_TIMEOUT_S, which may be
raised for slow commands). The SSH handshake now has its own short bound (VOLT_SSH_CONNECT_TIMEOUT_S),
answered with the one "not answering as an SSH server on port N" message (no port oracle, issue 9).
No wall-clock threshold: the listener holds the connection open far longer than the bound and records
whether the client hung up first.
"""

from __future__ import annotations

import socket
import threading

import pytest

from inventory import services
from inventory.choices import DriverKind
from inventory.drivers.base import HostUnreachable
from inventory.models import Host

HOLD_S = 30.0  # the listener keeps the connection this long unless the client leaves first


class SilentListener:
    """Accepts one connection on 127.0.0.1, reads what the client sends, never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.client_hung_up = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        conn.settimeout(HOLD_S)
        with conn:
            try:
                while conn.recv(4096):  # the client's own banner; b"" when it closes
                    pass
                self.client_hung_up.set()
            except (TimeoutError, OSError):
                pass  # held the whole time: we close first

    def close(self):
        self.thread.join(HOLD_S + 5)
        self.sock.close()


@pytest.mark.django_db
def test_a_silent_port_is_refused_after_the_ssh_connect_timeout_not_the_driver_timeout(settings):
    settings.VOLT_DRIVER_TIMEOUT_S = 120.0  # commands may be slow
    settings.VOLT_SSH_CONNECT_TIMEOUT_S = 1.0  # the handshake may not
    listener = SilentListener()
    host = Host(driver=DriverKind.SSH, address="127.0.0.1", ssh_port=listener.port, ssh_user="volt")
    driver = services.driver_for(host)
    try:
        with pytest.raises(HostUnreachable) as caught:
            driver.check_reachable()
    finally:
        driver.close()
        listener.close()

    assert f"127.0.0.1 is not answering as an SSH server on port {listener.port}" in str(caught.value)
    assert listener.client_hung_up.is_set()  # Volt gave up while the port still held the connection
