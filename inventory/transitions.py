"""Allowed host and provider transitions (one table each) and the functions that apply them."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from inventory.capacity import bump_capacity_version
from inventory.choices import HostEventKind, HostState, ProviderStatus
from inventory.models import Host, HostDrill, HostEvent, Provider
from voltweb import realtime, statemachine

S = HostState
HOST_TRANSITIONS: dict[str, dict[str, str]] = {
    S.ONBOARDING: {
        S.AVAILABLE: "discovery and health check passed",
        S.FAILED: "discovery or health check failed; the error says why",
        S.RETIRED: "provider gave up on the host while it was onboarding",
    },
    S.FAILED: {
        S.ONBOARDING: "provider fixed the problem and retried",
        S.RETIRED: "provider removed the host",
    },
    S.AVAILABLE: {
        S.DRAINING: "no new clusters; running ones finish",
        S.CORDONED: "taken out of scheduling at once (admin or failed health check)",
        S.OFFLINE: "heartbeats stopped",
        S.ONBOARDING: "re-discover hardware",
        S.RETIRED: "removed from the inventory",
    },
    S.DRAINING: {
        S.AVAILABLE: "drain cancelled",
        S.CORDONED: "escalated to cordon",
        S.OFFLINE: "heartbeats stopped",
        S.RETIRED: "drained host retired",
    },
    S.CORDONED: {
        S.AVAILABLE: "uncordoned after a passing health check",
        S.ONBOARDING: "re-discover hardware",
        S.OFFLINE: "heartbeats stopped",
        S.RETIRED: "removed from the inventory",
    },
    S.OFFLINE: {
        S.ONBOARDING: "re-discover once reachable",
        S.AVAILABLE: "heartbeats resumed and health check passed",
        S.RETIRED: "removed from the inventory",
    },
    S.RETIRED: {},
}

P = ProviderStatus
PROVIDER_TRANSITIONS: dict[str, dict[str, str]] = {
    P.PENDING: {P.APPROVED: "platform admin approved", P.SUSPENDED: "platform admin refused"},
    P.APPROVED: {P.SUSPENDED: "platform admin suspended the provider"},
    P.SUSPENDED: {P.APPROVED: "platform admin reinstated the provider"},
}


def transition_host(
    host: Host,
    to: str,
    reason: str = "",
    actor: AbstractBaseUser | None = None,
    extra: dict | None = None,
    drill: HostDrill | None = None,
) -> Host:
    """Move a host to `to`, recording the event and broadcasting to its page after commit.

    `drill`: a fault drill caused the move (recovery cordoned the host after it); the event names it, so
    the drill's cluster's end undoes it (inventory/drill_effects.py)."""

    def record(previous: str, target: str) -> None:
        HostEvent.objects.create(
            host=host,
            kind=HostEventKind.STATE,
            from_state=previous,
            to_state=target,
            message=reason or HOST_TRANSITIONS[previous][target],
            actor=_real(actor),
            drill=drill,
        )

    def announce() -> None:
        realtime.broadcast(f"host-{host.pk}", {"kind": "state", "state": host.state, "reason": reason})
        realtime.overview_changed("host")

    moved = statemachine.apply(host, to, HOST_TRANSITIONS, extra=extra, record=record, after_commit=announce)
    bump_capacity_version()  # a host entering or leaving AVAILABLE changes the offers
    return moved


def note_host(host: Host, kind: str, message: str) -> HostEvent:
    """A line in the host's history, shown live on its page."""
    event = HostEvent.objects.create(host=host, kind=kind, message=message)
    realtime.broadcast(f"host-{host.pk}", {"kind": kind, "message": message})
    return event


def transition_provider(provider: Provider, to: str, extra: dict | None = None) -> Provider:
    return statemachine.apply(provider, to, PROVIDER_TRANSITIONS, field="status", extra=extra)


def _real(actor: AbstractBaseUser | None) -> AbstractBaseUser | None:
    return actor if actor is not None and actor.is_authenticated else None
