"""What may be submitted to add a host, checked before anything is stored (API and console alike).

Each validator raises Django's ValidationError with a message that says what to send instead; the
API serializer uses them as field validators (a 400), and `services.add_host` runs them again for the
console and any other caller. Keys are parsed with asyncssh, never recognised by their text.
Who may add which host (approval, the `local` driver) is decided by `check_may_add_host`.
"""

from __future__ import annotations

import ipaddress
import re

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError

from inventory.choices import DriverKind, ProviderStatus
from inventory.drivers.ssh import InvalidKey, parse_private_key, parse_public_key_line
from inventory.models import Provider
from voltweb.domain import DomainError
from voltweb.services import is_platform_admin

# RFC 1123 host name labels: letters, digits and inner hyphens; at most 63 characters each.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# POSIX portable user names (what useradd accepts by default), 32 characters at most.
_SSH_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_NIC_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,31}$")
NIC_FIELDS = {"name", "link_layer", "rate_gbps", "state", "roce"}
NIC_LINK_LAYERS = ("InfiniBand", "Ethernet")
NIC_STATES = ("Active", "Down")
MAX_NICS = 16
MAX_KEY_CHARS = 16_384


class HostRefused(DomainError):
    """The caller may not add (or re-onboard) this host now; `code` names the rule, `status` the answer."""

    def __init__(self, message: str, code: str, status: int):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


def check_may_add_host(provider: Provider, driver: str, actor: AbstractBaseUser | None) -> None:
    """Raise HostRefused unless hosts may be onboarded for `provider` with `driver` by `actor`.

    Rules (DESIGN.md "Security"): a provider onboards hosts only once approved; the `local` driver
    exists only where VOLT_ALLOW_LOCAL_HOSTS is on, and then platform admins add local hosts (provider
    admins too where VOLT_LOCAL_HOSTS_FOR_PROVIDERS is on: the demo). `actor=None` is Volt itself
    (seed_demo, tests): it is held to the first two rules only.
    """
    check_provider_approved(provider)
    if driver != DriverKind.LOCAL:
        return
    if not settings.VOLT_ALLOW_LOCAL_HOSTS:
        raise HostRefused(
            "The local driver is turned off on this installation (it simulates hosts for demos and "
            "tests; VOLT_ALLOW_LOCAL_HOSTS enables it). Add the host with the ssh driver.",
            code="local_hosts_disabled",
            status=400,
        )
    if may_add_local_hosts(actor):
        return
    raise HostRefused(
        "Only platform admins add local (simulated) hosts here; add the host with the ssh driver.",
        code="local_hosts_admins_only",
        status=403,
    )


def may_add_local_hosts(actor: AbstractBaseUser | None) -> bool:
    """Whether `actor` may add hosts with the `local` driver here (see check_may_add_host)."""
    if not settings.VOLT_ALLOW_LOCAL_HOSTS:
        return False
    return actor is None or is_platform_admin(actor) or settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS


def check_provider_approved(provider: Provider) -> None:
    if provider.status != ProviderStatus.APPROVED:
        raise HostRefused(
            f"{provider.name} is {provider.get_status_display().lower()}: hosts can be onboarded once a "
            "platform admin has approved the provider. Describe your fabrics meanwhile.",
            code="provider_not_approved",
            status=409,
        )


def validate_address(value: str) -> None:
    """A host name or an IP address: no whitespace, shell metacharacters, leading '-' or port."""
    text = value or ""
    if not text:
        return
    try:
        ipaddress.ip_address(text)
        return
    except ValueError:
        pass
    labels = text.rstrip(".").split(".") if len(text) <= 253 else []
    if not labels or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValidationError(
            "Give a host name (letters, digits, hyphens and dots, e.g. gpu-07.example.net) or an IP "
            "address, without spaces, port or user.",
            code="invalid_address",
        )


def validate_udp_endpoint(value: str) -> None:
    """ "ADDRESS:PORT" of a forwarded UDP port (IPv4 address or host name; port 1-65535), or blank."""
    text = value or ""
    if not text:
        return
    address, _, port = text.rpartition(":")
    problem = not address or not port.isdigit() or not 0 < int(port) < 65536
    if not problem:
        try:
            validate_address(address)
        except ValidationError:
            problem = True
    if problem or ":" in address:
        raise ValidationError(
            "Give the public address and UDP port your provider forwards to this host's overlay port "
            "(51820), e.g. 203.0.113.7:51821; leave it blank when none is forwarded.",
            code="invalid_endpoint",
        )


def validate_ssh_user(value: str) -> None:
    if value and not _SSH_USER.fullmatch(value):
        raise ValidationError(
            "Give a Unix user name: letters, digits, '_', '.' or '-', not starting with '-' or a digit, "
            "at most 32 characters.",
            code="invalid_ssh_user",
        )


def validate_private_key(value: str) -> None:
    """An unencrypted private key that asyncssh can read (OpenSSH or PEM)."""
    if not value:
        return
    if len(value) > MAX_KEY_CHARS:
        raise ValidationError("This is too long for an SSH private key.", code="invalid_private_key")
    try:
        parse_private_key(value)
    except InvalidKey:
        # The parser's own message may quote the text: never echo a private key back.
        raise ValidationError(
            "This is not an unencrypted SSH private key; paste the whole key, from "
            "'-----BEGIN OPENSSH PRIVATE KEY-----' to its END line (remove any passphrase first).",
            code="invalid_private_key",
        ) from None


def validate_host_key(value: str) -> None:
    """A public host key line as ssh-keyscan prints it."""
    if not value or not value.strip():
        return
    if len(value) > MAX_KEY_CHARS or "\n" in value.strip():
        raise ValidationError("Give one host key line, e.g. 'ssh-ed25519 AAAA...'.", code="invalid_host_key")
    try:
        parse_public_key_line(value)
    except InvalidKey as exc:
        raise ValidationError(str(exc), code="invalid_host_key") from None


def validate_nics(value) -> None:
    """A local host's NICs: [{"name", "link_layer", "rate_gbps", "state"?, "roce"?}], at most 16."""
    if value is None:
        return
    if not isinstance(value, list | tuple) or len(value) > MAX_NICS:
        raise ValidationError(f"Give a list of at most {MAX_NICS} NICs.", code="invalid_nics")
    for number, nic in enumerate(value):
        problem = _nic_problem(nic)
        if problem:
            raise ValidationError(f"NIC {number}: {problem}", code="invalid_nics")


def _nic_problem(nic) -> str:
    if not isinstance(nic, dict):
        return "give an object with name, link_layer and rate_gbps."
    unknown = set(nic) - NIC_FIELDS
    if unknown:
        return (
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}; use {', '.join(sorted(NIC_FIELDS))}."
        )
    if not isinstance(nic.get("name"), str) or not _NIC_NAME.fullmatch(nic["name"]):
        return "name must be a device name such as mlx5_0 (letters, digits, '_', '.', ':', '-')."
    if nic.get("link_layer", "InfiniBand") not in NIC_LINK_LAYERS:
        return f"link_layer must be one of {', '.join(NIC_LINK_LAYERS)}."
    rate = nic.get("rate_gbps", 400)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 1 <= rate <= 3200:
        return "rate_gbps must be a number from 1 to 3200."
    if nic.get("state", "Active") not in NIC_STATES:
        return f"state must be one of {', '.join(NIC_STATES)}."
    if not isinstance(nic.get("roce", True), bool):
        return "roce must be true or false (an Ethernet port with or without RoCE)."
    return ""


def host_request_errors(
    address: str, ssh_user: str, ssh_private_key: str, ssh_host_key: str, nics
) -> dict[str, list[str]]:
    """Every field problem of a host request at once, keyed by field name (empty: all valid)."""
    checks = {
        "address": (validate_address, address),
        "ssh_user": (validate_ssh_user, ssh_user),
        "ssh_private_key": (validate_private_key, ssh_private_key),
        "ssh_host_key": (validate_host_key, ssh_host_key),
        "nics": (validate_nics, nics),
    }
    errors: dict[str, list[str]] = {}
    for field, (check, value) in checks.items():
        try:
            check(value)
        except ValidationError as exc:
            errors[field] = exc.messages
    return errors
