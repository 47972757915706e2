"""Host drivers: one interface (`HostDriver`), two implementations (`local`, `ssh`), and `sudo.SudoDriver`,
which runs another driver's commands as root (cluster work on SSH hosts where Volt may use sudo)."""

from inventory.drivers.base import (
    AuthenticationRefused,
    CommandResult,
    CommandTimeout,
    DriverError,
    HostDriver,
    HostKeyMismatch,
    HostUnreachable,
    fan_out,
)

__all__ = [
    "AuthenticationRefused",
    "CommandResult",
    "CommandTimeout",
    "DriverError",
    "HostDriver",
    "HostKeyMismatch",
    "HostUnreachable",
    "fan_out",
]
