"""Who reaches whom directly, recorded from checks made on the hosts themselves (issue 26, item 1).

A check of host H: H opens a listener on its node address (Host.node_ip, a port the kernel picks) for a few
seconds, and each of up to PEERS other hosts of H's provider opens a TCP connection to it, from the peer
itself. One row per (host, peer) (HostReach), replaced by each check. Not a port Volt assumes open (sshd's)
but a fresh one, as Ray and collectives need any port. Onboarding queues a check of each SSH host; beat
re-checks the stalest (`recheck`).

`networks(hosts)` groups hosts that reach each other directly: the connected components of successful
checks, through any host of their providers (a provider network is one IP network: if a reaches b and b
reaches c, a reaches c). Two hosts in different components get an overlay (clusters/provisioning/overlay.py).
Local hosts share this machine's loopback: one network, no check.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Max, Q
from django.utils import timezone

from inventory import transitions
from inventory.choices import DriverKind, HostEventKind, HostState
from inventory.drivers.base import DriverError
from inventory.models import Host, HostReach
from inventory.services import driver_for

logger = logging.getLogger(__name__)
PEERS = 3
LISTEN_S = 20
LOCAL_NETWORK = "local"
CHECKED_STATES = (HostState.AVAILABLE, HostState.DRAINING, HostState.CORDONED)

# On the host: listen on its node address, print the port, answer each connection, end after `count`
# connections or LISTEN_S seconds.
LISTENER = f"""
import socket, sys, time
server = socket.create_server((sys.argv[1], 0))
server.settimeout(1)
print(server.getsockname()[1], flush=True)
left, end = int(sys.argv[2]), time.monotonic() + {LISTEN_S}
while left > 0 and time.monotonic() < end:
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    conn.sendall(b"volt-reach\\n")
    conn.close()
    left -= 1
"""
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as sock:
        print("ok" if sock.recv(16).startswith(b"volt-reach") else "no: another service answered")
except OSError as exc:
    print("no:", exc)
"""


def peers_of(host: Host) -> list[Host]:
    """Up to PEERS other SSH hosts of its provider that Volt reaches, most recently checked first."""
    return list(
        Host.objects.filter(provider_id=host.provider_id, driver=DriverKind.SSH, state__in=CHECKED_STATES)
        .exclude(pk=host.pk)
        .order_by("-last_heartbeat_at", "pk")[:PEERS]
    )


def check(host: Host) -> list[HostReach]:
    """Check which peers reach `host`'s node address; record and return the rows. A host that cannot listen
    is recorded as reached by none."""
    if host.driver == DriverKind.LOCAL:
        return []
    peers = peers_of(host)
    if not peers:
        return []
    address = host.node_ip
    results: dict[int, tuple[bool, str]] = {}
    try:
        with driver_for(host) as driver:
            port = _listen(driver, address, len(peers))
    except (DriverError, ValueError) as exc:
        port, problem = None, f"{host.name} could not listen on {address}: {exc}"
    for peer in peers:
        if port is None:
            results[peer.pk] = (False, problem[:300])
            continue
        results[peer.pk] = _connect(peer, address, port)
    rows = []
    for peer in peers:
        ok, detail = results[peer.pk]
        row, _ = HostReach.objects.update_or_create(
            host=host,
            peer=peer,
            defaults={"address": address, "ok": ok, "detail": detail, "checked_at": timezone.now()},
        )
        rows.append(row)
    reached = [p.name for p in peers if results[p.pk][0]]
    missed = [p.name for p in peers if not results[p.pk][0]]
    message = f"{address} reached directly from {', '.join(reached) or 'no peer'}"
    if missed:
        first = next(p for p in peers if not results[p.pk][0])
        message += f"; not from {', '.join(missed)} ({first.name}: {results[first.pk][1]})"
    transitions.note_host(host, HostEventKind.REACH, message[:1000])
    return rows


def _listen(driver, address: str, count: int) -> int:
    script = "\n".join(
        [
            "out=$(mktemp)",
            f"timeout {LISTEN_S + 5} python3 -c {shlex.quote(LISTENER)} {shlex.quote(address)} {count} "
            '>"$out" 2>&1 </dev/null &',
            'for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.1; done',
            'head -c 500 "$out"; rm -f "$out"',
        ]
    )
    result = driver.run(script, timeout=30)
    first = result.stdout.strip().splitlines()[:1]
    if not first or not first[0].isdigit():
        raise DriverError((result.stdout + result.stderr).strip()[-200:] or "the listener printed nothing")
    return int(first[0])


def _connect(peer: Host, address: str, port: int) -> tuple[bool, str]:
    try:
        with driver_for(peer) as driver:
            result = driver.run(
                f"python3 -c {shlex.quote(CONNECT)} {shlex.quote(address)} {port}", timeout=20
            )
    except (DriverError, ValueError) as exc:
        return False, f"{peer.name} could not run the check: {exc}"[:300]
    line = (result.stdout.strip().splitlines() or [""])[-1]
    if line == "ok":
        return True, ""
    return False, (line or result.stderr.strip())[:300]


def networks(hosts: Iterable[Host]) -> dict[int, str]:
    """Each host's network: hosts with one label reach each other directly (see the module's docstring).

    A host with no check on record (none of its provider's peers was up to check it, or its check has not
    run yet) counts as in its provider's network, as Volt assumed before checks existed; one that was checked
    is where its checks put it. Hosts of different providers never share a network."""
    hosts = list(hosts)
    parent: dict[object, object] = {}

    def find(x: object) -> object:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: object, b: object) -> None:
        a, b = find(a), find(b)
        if a != b:
            parent[b] = a

    providers = {h.provider_id for h in hosts if h.driver != DriverKind.LOCAL}
    rows = list(
        HostReach.objects.filter(host__provider_id__in=providers).values_list("host_id", "peer_id", "ok")
    )
    checked = {host_id for host_id, _, _ in rows}  # a peer's failure to reach another says nothing of it
    for host_id, peer_id, ok in rows:
        if ok:
            union(host_id, peer_id)
    for host in hosts:
        if host.driver != DriverKind.LOCAL and host.pk not in checked:
            union(("provider", host.provider_id), host.pk)
    labels = {}
    for host in hosts:
        root = find(host.pk)
        labels[host.pk] = (
            LOCAL_NETWORK if host.driver == DriverKind.LOCAL else f"net-{host.provider_id}-{root}"
        )
    return labels


def stale(limit: int) -> list[Host]:
    """SSH hosts whose last check is older than VOLT_REACHABILITY_RECHECK_S (or that have none), stalest first."""
    since = timezone.now() - timedelta(seconds=settings.VOLT_REACHABILITY_RECHECK_S)
    return list(
        Host.objects.filter(driver=DriverKind.SSH, state__in=CHECKED_STATES)
        .annotate(last_checked=Max("reached_by__checked_at"))
        .filter(Q(last_checked__isnull=True) | Q(last_checked__lt=since))
        .order_by(F("last_checked").asc(nulls_first=True), "pk")[:limit]
    )


def recheck(limit: int = 5) -> int:
    """Check the `limit` stalest hosts (beat); a host whose check fails is logged, never raised."""
    done = 0
    for host in stale(limit):
        if not peers_of(host):
            continue
        try:
            check(host)
            done += 1
        except Exception:  # noqa: BLE001 - one host's failure must not stop the others
            logger.exception("reachability check of host %s failed", host.pk)
    return done
