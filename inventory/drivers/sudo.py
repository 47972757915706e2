"""A driver that runs another driver's commands as root through `sudo -n`: how Volt acts on an SSH host whose
login user may use passwordless sudo, where a cluster's Ray runs as a Unix user of the cluster's own.

Starting Ray as another user (`setpriv`), finding a node by reading `/proc/<pid>/environ` of that user's
processes, killing them, reading a job's log as its user: each needs root. Everything written through this
driver is root's; `~` stays the login user's home (HOME is kept), so paths mean what they mean through the
plain driver. Copies go to a private folder of the login's over SFTP first (the session's own rights), then
root installs them in place (mode 0600, root's) and removes the upload. Pure Python.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path

from inventory.drivers.base import CommandResult, DriverError, HostDriver

# sudo resets the environment: HOME is handed over from the login session, so `~` is the same folder.
_PREFIX = 'sudo -n env HOME="$HOME" sh -c '
_UPLOADS = ".volt-uploads"


class SudoDriver(HostDriver):
    """`inner`'s host, its commands run as root through passwordless sudo. Closing it closes `inner`."""

    def __init__(self, inner: HostDriver) -> None:
        self.inner = inner
        self.address = inner.address
        self.host = getattr(inner, "host", None)

    def __repr__(self) -> str:
        return f"<SudoDriver {self.address}>"

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        result = self.inner.run(as_root(command), timeout=timeout)
        if result.exit_status == 1 and "sudo: a password is required" in result.stderr:
            raise DriverError(
                f"{self.address} no longer lets Volt's user use sudo without a password: give it passwordless "
                "sudo again (or rediscover the host, which then runs its clusters as that user)."
            )
        return result

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        # Into a folder of the login's own, mode 0700: the upload is written before any chmod could close it,
        # and a home open to others (0755 on older Debian and Ubuntu) must not show it in between.
        made = self.inner.run(f"mkdir -p ~/{_UPLOADS} && chmod 700 ~/{_UPLOADS}", timeout=timeout)
        if not made.ok:
            raise DriverError(
                f"could not make ~/{_UPLOADS} on {self.address}: {(made.stderr or made.stdout).strip()[:300]}"
            )
        upload = f"{_UPLOADS}/{secrets.token_hex(8)}"
        self.inner.copy_file(local_path, upload, timeout=timeout)
        target = (
            shlex.quote(remote_path) if remote_path.startswith("/") else f'"$HOME"/{shlex.quote(remote_path)}'
        )
        staged = f'"$HOME"/{upload}'
        result = self.run(
            f"install -m 600 {staged} {target}; status=$?; rm -f {staged}; exit $status", timeout
        )
        if not result.ok:
            self.inner.run(f"rm -f ~/{upload}", timeout=20)
            raise DriverError(
                f"could not put {remote_path} in place on {self.address}: "
                f"{(result.stderr or result.stdout).strip()[:300]}"
            )

    def check_reachable(self, timeout: float | None = None) -> None:
        self.inner.check_reachable(timeout)

    def close(self) -> None:
        self.inner.close()


def as_root(command: str) -> str:
    """`command` run by root through `sudo -n`, with the login session's HOME."""
    return _PREFIX + shlex.quote(command)
