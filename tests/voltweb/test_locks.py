"""A worker releases only its own lock (voltweb/locks.py), against the real Redis of Volt's cache: the
get-then-delete it replaces deleted a lock that had expired and been taken by another worker."""

from __future__ import annotations

import uuid

from django.core.cache import cache

from voltweb import locks


def test_a_lock_that_expired_and_was_retaken_is_not_released_by_its_first_holder():
    key = f"test-lock-{uuid.uuid4().hex}"
    assert cache.add(key, "first", timeout=60)
    cache.set(key, "second", timeout=60)  # "first"'s lock expired; another worker took it

    assert locks.release(key, "first") is False
    assert cache.get(key) == "second"
    assert locks.release(key, "second") is True
    assert cache.get(key) is None
    assert locks.release(key, "second") is False  # nothing left to release
