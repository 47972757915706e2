"""Volt's own services are closed to the clusters' users on this machine: DESIGN.md "Security".

`local` hosts share Volt's machine and network namespace. A job (code the team uploads) runs as the
cluster's Unix user and could otherwise open Volt's Redis (read every install's channels, push a Celery
message that Volt's worker runs as root), its PostgreSQL (trust auth on a developer's machine) and its web
port. Two walls, both set up as root where a cluster user exists:

- network: one nftables table per Volt install (`inet volt_<install id>`) with an output rule that refuses
  (TCP reset) every connection from a cluster user's uid to one of Volt's service ports on any address of
  this machine (`fib daddr type local`: loopback and the machine's own addresses alike). The cluster's
  own traffic (Ray on 127.0.0.N, gloo, the dashboard) uses other ports and passes untouched. Uids are
  admitted when the cluster's user is made and released when it goes; the table goes with its last uid.
- files: Unix sockets (PostgreSQL's folder, a Redis socket) are hidden from the node's processes by a
  private mount namespace in which an empty tmpfs covers their folders (`hide_prefix`, used by ray_nodes'
  launcher before it drops to the cluster's user).

Pure Python over a host driver (local hosts: this machine), like node_users.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence

from inventory.drivers.base import DriverError, HostDriver

NO_NFT = "VOLT_NO_NFT"
NOT_ROOT = "VOLT_NOT_ROOT"
LOCK = "/tmp/volt-nft.lock"  # one nft transaction at a time on the machine (admit and release race)
_INSTALL = re.compile(r"^[a-f0-9]{1,16}$")
_PATH = re.compile(r"^/[A-Za-z0-9_./@+-]*$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


class FirewallFailed(DriverError):
    """The rules that keep cluster users off Volt's ports could not be written (the host's output says why)."""

    code = "node_firewall_failed"


def table_name(install_id: str) -> str:
    if not _INSTALL.match(install_id):
        raise ValueError(f"{install_id!r} is not an install id.")
    return f"volt_{install_id}"


def ruleset(install_id: str, uid: int, ports: Iterable[int]) -> str:
    """The nft script that admits `uid` and sets the ports (idempotent: one rule, sets rewritten)."""
    table = f"inet {table_name(install_id)}"
    port_list = ", ".join(str(int(p)) for p in sorted(set(ports)) if 0 < int(p) < 65536)
    lines = [
        f"add table {table}",
        f"add set {table} cluster_uids {{ typeof meta skuid; }}",
        f"add set {table} volt_ports {{ typeof tcp dport; }}",
        f"add chain {table} output {{ type filter hook output priority 0; policy accept; }}",
        f"flush chain {table} output",
        # Cheapest test first: the uid, then the port; the route lookup (fib) only for packets to Volt's
        # ports, never for the cluster's own traffic (every packet of its probe and collectives).
        f"add rule {table} output meta skuid @cluster_uids tcp dport @volt_ports fib daddr type local "
        "counter reject with tcp reset",
        f"add element {table} cluster_uids {{ {int(uid)} }}",
        f"flush set {table} volt_ports",
    ]
    if port_list:
        lines.append(f"add element {table} volt_ports {{ {port_list} }}")
    return "\n".join(lines) + "\n"


def admit(driver: HostDriver, install_id: str, uid: int, ports: Iterable[int], timeout: float = 30) -> bool:
    """Refuse `uid`'s connections to `ports` on this machine. True when the rule is in place; False when it
    cannot be (not root, or no `nft`): the caller says so on the timeline. Raises FirewallFailed."""
    script = "\n".join(
        [
            f'[ "$(id -u)" = 0 ] || {{ echo {NOT_ROOT}; exit 0; }}',
            'PATH="$PATH:/usr/sbin:/sbin"',
            f"command -v nft >/dev/null 2>&1 || {{ echo {NO_NFT}; exit 0; }}",
            f"flock -w 20 {LOCK} nft -f - <<'VOLT_NFT'",
            ruleset(install_id, uid, ports).rstrip("\n"),
            "VOLT_NFT",
            "rc=$?",
            '[ "$rc" = 0 ] && echo VOLT_ADMITTED',
            'exit "$rc"',
        ]
    )
    result = driver.run(script, timeout=timeout)
    if NOT_ROOT in result.stdout or NO_NFT in result.stdout:
        return False
    if not result.ok or "VOLT_ADMITTED" not in result.stdout:
        output = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise FirewallFailed(f"could not close Volt's ports to uid {uid} on {driver.address}: {output}")
    return True


def release(driver: HostDriver, install_id: str, uid: int, timeout: float = 30) -> None:
    """Take `uid` out of the install's table; the table goes with its last uid. Idempotent."""
    table = f"inet {table_name(install_id)}"
    script = "\n".join(
        [
            'PATH="$PATH:/usr/sbin:/sbin"',
            "command -v nft >/dev/null 2>&1 || exit 0",
            f"nft list table {table} >/dev/null 2>&1 || exit 0",
            f"exec 8>{LOCK}; flock -w 20 8 || exit 4",
            f"nft delete element {table} cluster_uids {{ {int(uid)} }} 2>/dev/null",
            f"if ! nft list set {table} cluster_uids | grep -q 'elements'; then nft delete table {table}; fi",
            "echo VOLT_RELEASED",
        ]
    )
    result = driver.run(script, timeout=timeout)
    if not result.ok:
        output = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise FirewallFailed(f"could not release uid {uid} from Volt's rules on {driver.address}: {output}")


def remove_table(driver: HostDriver, install_id: str, timeout: float = 30) -> None:
    """Drop the install's whole table (its last cluster gone, the demo stopping)."""
    table = f"inet {table_name(install_id)}"
    driver.run(
        f'PATH="$PATH:/usr/sbin:/sbin"; command -v nft >/dev/null 2>&1 && nft delete table {table} 2>/dev/null; true',
        timeout=timeout,
    )


def hide_prefix(paths: Sequence[str], hostname: str | None = None) -> str:
    """`unshare ... -- sh -c '...' volt-node ` that runs what follows in a private mount namespace where an
    empty tmpfs covers each existing folder of `paths` (Unix sockets of Volt's services) and, with
    `hostname`, in a UTS namespace of its own named so. Needs root; "" when there is nothing to do. A step
    that fails stops the node from starting (fail closed).

    The host name is a local host's address (127.0.0.N): gloo, unless told otherwise, binds to what the
    host name resolves to, so a job's collectives leave from and listen on its host's address like a real
    host's — on 127.0.0.1 every local host's traffic escaped the emulated fabric's shaping."""
    folders = [p for p in paths if p and _PATH.match(p)]
    name = hostname if hostname and _HOSTNAME.match(hostname) else None
    if not folders and not name:
        return ""
    steps = [f"hostname {shlex.quote(name)} || exit 7"] if name else []
    if folders:
        steps.append(
            f"for d in {' '.join(shlex.quote(f) for f in folders)}; do "
            'if [ -d "$d" ]; then mount -t tmpfs -o size=4k,mode=0755 volt-hidden "$d" || exit 7; fi; done'
        )
    flags = "--mount --uts" if name else "--mount"
    body = "; ".join([*steps, 'exec "$@"'])
    return f"unshare {flags} --propagation private -- sh -c {shlex.quote(body)} volt-node "
