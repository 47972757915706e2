"""The capacity version: a number that changes whenever free capacity or host availability changes, so
cached offers and placement indexes are never used across a change. Below host transitions (a host entering
or leaving AVAILABLE bumps it) and allocation (every allocation and release does)."""

from __future__ import annotations

import time

from django.core.cache import cache
from django.db import transaction

CAPACITY_VERSION_KEY = "inventory:capacity-version"


def bump_capacity_version() -> None:
    """Invalidate cached offers: now (this transaction's readers) and again after commit."""

    def bump() -> None:
        try:
            cache.incr(CAPACITY_VERSION_KEY)
        except ValueError:  # missing (or not a number): any new value invalidates
            cache.set(CAPACITY_VERSION_KEY, time.time_ns(), None)

    bump()
    transaction.on_commit(bump)


def capacity_version() -> int:
    """A number that changes whenever free capacity or host availability changes (shared via the cache)."""
    return cache.get_or_set(CAPACITY_VERSION_KEY, 1, None)
