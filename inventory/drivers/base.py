"""The host driver interface. Pure Python: drivers know nothing of Django models.

A driver runs shell commands on one provider host, copies files to it, and says whether it is
reachable. Provisioning and discovery code is written once against this interface.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class DriverError(Exception):
    """A host could not be driven. `code` is machine-readable; the message says what to do."""

    code = "driver_error"


class HostUnreachable(DriverError):
    code = "unreachable"


class AuthenticationRefused(DriverError):
    code = "auth_refused"


class HostKeyMismatch(DriverError):
    code = "host_key_mismatch"


class CommandTimeout(DriverError):
    code = "timeout"


class HostDriver(abc.ABC):
    """One provider host. Implementations must be safe to use from one thread at a time."""

    #: Human-readable address for messages ("127.0.0.5", "ubuntu@10.0.0.4:22").
    address: str

    @abc.abstractmethod
    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run a shell command; a non-zero exit is returned, not raised. Timeouts raise CommandTimeout."""

    @abc.abstractmethod
    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        """Copy a local file to `remote_path` on the host (relative paths are under the host's home)."""

    @abc.abstractmethod
    def check_reachable(self, timeout: float | None = None) -> None:
        """Return if the host answers; raise HostUnreachable / AuthenticationRefused / HostKeyMismatch."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


T = TypeVar("T")


def fan_out(
    drivers: Sequence[HostDriver], fn: Callable[[HostDriver], T], max_workers: int = 32
) -> list[T | BaseException]:
    """Call `fn(driver)` for every driver in parallel; each slot holds a result or the exception raised.

    Results come back in the order of `drivers`, so callers can pair failures with hosts.
    """
    if not drivers:
        return []

    def call(driver: HostDriver) -> T | BaseException:
        try:
            return fn(driver)
        except Exception as exc:  # noqa: BLE001 - returned to the caller, who decides
            return exc

    with ThreadPoolExecutor(max_workers=min(max_workers, len(drivers))) as pool:
        return list(pool.map(call, drivers))
