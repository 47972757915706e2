"""How this process reaches a port of an SSH host that only the host's own network sees: a local SSH
forward (`ssh -L`, what Ray's `ray dashboard` does), kept open per process and host.

Providers open SSH alone (DESIGN.md "Networks between hosts"): a cluster head's dashboard listens on the
head's private address, which Volt's control plane cannot route to (a lab machine's 10.77.p.k, a provider
machine behind NAT). Every HTTP call Volt makes to a head (state API, job submission, logs) goes to
`http_url(host, url)`, which is `url` itself on a local host and `http://127.0.0.1:<port>` on an SSH
host, where the port forwards over the host's SSH connection to the address and port of `url` as the
host sees them.

A forward belongs to the process that opened it (a driver's connection and event loop do not survive a
fork, so a Celery child never uses its parent's): one SSH connection per host and process, at most
MAX_OPEN of them (the least recently used is closed). A connection that dropped (the host rebooted) is
made again on the next call.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from urllib.parse import urlsplit, urlunsplit

from inventory import services
from inventory.choices import DriverKind
from inventory.models import Host

MAX_OPEN = 32

_lock = threading.Lock()
_owner_pid = os.getpid()
_drivers: OrderedDict[tuple, object] = OrderedDict()


def _identity(host: Host) -> tuple:
    """A record that changed its address, port, user, key or pinned host key gets a new connection."""
    return (host.pk, host.address, host.ssh_port, host.ssh_user, host.ssh_private_key_encrypted,
            host.ssh_host_key)  # fmt: skip


def _driver(host: Host):
    global _owner_pid
    evicted = []
    with _lock:
        if _owner_pid != os.getpid():  # forked: the parent's connections are not ours to use or close
            _drivers.clear()
            _owner_pid = os.getpid()
        key = _identity(host)
        driver = _drivers.get(key)
        if driver is None:
            evicted += [_drivers.pop(k) for k in [k for k in _drivers if k[0] == host.pk]]
            driver = _drivers[key] = services.driver_for(host)
            while len(_drivers) > MAX_OPEN:
                evicted.append(_drivers.popitem(last=False)[1])
        _drivers.move_to_end(key)
    for old in evicted:  # outside the lock: closing waits on the connection (seconds, when a host is gone)
        old.close()
    return driver


def http_url(host: Host, url: str) -> str:
    """`url` (http://ADDRESS:PORT[/path], an address as `host` sees it) as this process reaches it.

    Raises DriverError when the host cannot be reached over SSH or refuses to forward."""
    if not url or host.driver == DriverKind.LOCAL:
        return url
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"{url!r} has no address and port to forward to")
    port = _driver(host).forward(parts.hostname, parts.port)
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def close_all() -> None:
    """Close every forward of this process (tests; a worker shutting down)."""
    with _lock:
        while _drivers:
            _drivers.popitem()[1].close()
