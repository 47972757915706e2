"""A Unix user of the cluster's own, for its Ray processes, on hosts where Volt has the privilege.

Ray runs a team's code (its jobs) with the rights of the user that started Ray. As Volt's own user, a
job could read Volt's processes (`/proc/<pid>/environ`: database URL, secret key) and every other
cluster's files on the host. Where the driver's user is root, each cluster gets a system user
(`useradd --system`, no login shell, no home) that owns only its nodes' temp dirs and storage;
`remove_user` kills whatever still runs as it (a job that escaped its node's process group included),
disowns or removes its files, and deletes it, so a later user given the same uid inherits nothing.
Where the driver's user is not root, `ensure_user` says so and Ray runs as that user. Pure Python.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence

from inventory.drivers.base import DriverError, HostDriver

_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_NOT_ROOT = "VOLT_NOT_ROOT"
_SBIN = 'PATH="$PATH:/usr/sbin:/sbin"'  # useradd/userdel live there; a host session's PATH may lack them


class UserSetupFailed(DriverError):
    """The cluster's Unix user could not be created or removed (the message carries the host's output)."""

    code = "node_user_failed"


def user_name(cluster_number: int, install: str) -> str:
    """`volt<cluster>-<8 hex>`: the hex names the Volt install (several may share a machine)."""
    digest = hashlib.sha256(install.encode()).hexdigest()[:8]
    return f"volt{int(cluster_number)}-{digest}"


def ensure_user(driver: HostDriver, name: str, timeout: float = 60, *, uid: int | None = None) -> bool:
    """Create the user (and its group) if missing; True when Ray can run as it, False when not root.

    `uid` fixes the user's (and its group's) id: SSH hosts that mount one shared storage folder must agree
    on who owns the cluster's files there (useradd would pick a different free id on each host). A user of
    that name with another id, or the id taken by another user, is refused with what to do."""
    _check(name)
    quoted = shlex.quote(name)
    if uid is None:
        add = (
            f"useradd --system --user-group --no-create-home --home-dir /nonexistent "
            f"--shell /usr/sbin/nologin {quoted}"
        )
        clash = []
    else:
        number = int(uid)
        # -l: no lastlog/faillog entry (a high uid makes those files huge, sparse or not).
        add = (
            f"{{ getent group {quoted} >/dev/null || groupadd --gid {number} {quoted}; }} && "
            f"useradd --uid {number} --gid {number} -l --no-create-home --home-dir /nonexistent "
            f"--shell /usr/sbin/nologin {quoted}"
        )
        clash = [
            f'taken=$(getent passwd {number} | cut -d: -f1); if [ -n "$taken" ] && [ "$taken" != {quoted} ]; then',
            f'  echo "VOLT_CLASH uid {number} already belongs to $taken"; exit 0; fi',
        ]
    script = "\n".join(
        [
            f'[ "$(id -u)" = 0 ] || {{ echo {_NOT_ROOT}; exit 0; }}',
            _SBIN,
            *clash,
            # useradd takes /etc/passwd's lock; another cluster's user being added at once makes it fail
            # with "cannot lock": try again a few times.
            "for attempt in 1 2 3 4 5 6 7 8 9 10; do",
            f"  id -u {quoted} >/dev/null 2>&1 && break",
            f"  {add} && break",
            "  sleep 0.5",
            "done",
            f'echo "VOLT_USER $(id -u {quoted})"',
        ]
    )
    result = driver.run(script, timeout=timeout)
    if _NOT_ROOT in result.stdout:
        return False
    clashed = re.search(r"^VOLT_CLASH (.*)$", result.stdout, re.MULTILINE)
    if clashed:
        raise UserSetupFailed(
            f"could not create the cluster's user {name} on {driver.address}: {clashed.group(1)}. Another "
            "Volt install sharing this host uses the same ids: give one of them another VOLT_SSH_NODE_UID_BASE."
        )
    made = re.search(r"^VOLT_USER (\d+)$", result.stdout, re.MULTILINE)
    if not result.ok or not made:
        output = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise UserSetupFailed(f"could not create the cluster's user {name} on {driver.address}: {output}")
    if uid is not None and int(made.group(1)) != int(uid):
        raise UserSetupFailed(
            f"the cluster's user {name} on {driver.address} has uid {made.group(1)}, not {uid}: remove that "
            f"user (`userdel {name}`) and provision again."
        )
    return True


def uid_of(driver: HostDriver, name: str, timeout: float = 20) -> int | None:
    """The user's uid on the host, or None when there is no such user."""
    _check(name)
    result = driver.run(f"id -u {shlex.quote(name)} 2>/dev/null || true", timeout=timeout)
    match = re.search(r"^(\d+)$", result.stdout, re.MULTILINE)
    return int(match.group(1)) if match else None


def remove_user(
    driver: HostDriver,
    name: str,
    *,
    remove_dirs: Sequence[str] = (),
    disown_dirs: Sequence[str] = (),
    timeout: float = 90,
) -> None:
    """Kill every process of the user, then delete it. Idempotent.

    `remove_dirs` are deleted if the user owns them (its nodes' temp dirs: logs, the token);
    `disown_dirs` are given back to root (shared storage the team may still want, unreadable to a later
    user that gets the same uid).
    """
    _check(name)
    quoted = shlex.quote(name)
    removals = " ".join(shlex.quote(path) for path in remove_dirs)
    disowns = " ".join(shlex.quote(path) for path in disown_dirs)
    script = "\n".join(
        [
            f"id -u {quoted} >/dev/null 2>&1 || {{ echo VOLT_GONE; exit 0; }}",
            _SBIN,
            # SIGKILLed processes still take time to exit on a loaded (or CPU-throttled) host: up to 30 s.
            "for attempt in $(seq 1 150); do",
            f"  left=$(ps -u {quoted} -o pid=,stat= | awk '$2 !~ /^Z/ {{print $1}}')",
            '  [ -z "$left" ] && break',
            "  kill -KILL $left 2>/dev/null; sleep 0.2",
            "done",
            f'for d in {removals}; do [ -d "$d" ] && [ "$(stat -c %U "$d")" = {quoted} ] && rm -rf "$d"; done',
            f'for d in {disowns}; do [ -e "$d" ] && chown -R 0:0 "$d"; done',
            # -f: a zombie nobody reaps (no init in some containers) still counts as "in use".
            f"userdel {quoted} 2>/dev/null || userdel -f {quoted}",
            f"id -u {quoted} >/dev/null 2>&1 && exit 3",
            "echo VOLT_GONE",
        ]
    )
    result = driver.run(script, timeout=timeout)
    if "VOLT_GONE" not in result.stdout:
        output = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise UserSetupFailed(f"could not remove the cluster's user {name} on {driver.address}: {output}")


def _check(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a Unix user name.")
