"""Host drivers: one interface (`HostDriver`), two implementations (`local`, `ssh`)."""

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
