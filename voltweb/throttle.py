"""Throttling of failed authentication: sign-ins per (account, address) and per address, bad bearer tokens
per address.

A fixed window per key in the shared cache (Redis in every deployment, so every web process counts
together): failures are counted with an atomic INCR, the window's end is stored beside the count, and
once a key holds `limit` failures every further attempt under that key is refused until the window ends —
even with the right password, which is what stops guessing.

No caller can lock others out (issue 21): an account's failures are counted per address, so guessing the
platform admin's password from one address stops that address, not the admin at another; and a valid
bearer token is accepted before any counter is looked at, so other callers' bad tokens from a shared
address (an office's NAT) never refuse it. A success resets that (account, address) count, not the
address's. What this gives up: guesses at one account spread over many addresses are bounded per address
(VOLT_LOGIN_FAILURES_PER_ACCOUNT each, VOLT_LOGIN_FAILURES_PER_ADDRESS over all accounts), not in total.

Chosen over django-axes: axes throttles only what goes through `authenticate()` (not bearer tokens),
keeps its counters in database tables with a migration and middleware, and the API needs its refusals
in the API's own error shape; the counting here is a few cache calls the tests can drive with a
mocked clock (`now`).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

#: Cache key prefix of every counter (tests give each test its own).
KEY_PREFIX = "throttle"


def now() -> float:
    """The clock the windows use (tests replace it)."""
    return time.time()


@dataclass(frozen=True)
class Limit:
    """`limit` failures per `window_s` seconds for keys of one scope (e.g. "login-account")."""

    scope: str
    limit: int
    window_s: int

    def _keys(self, subject: str) -> tuple[str, str]:
        digest = hashlib.sha256(subject.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        base = f"{KEY_PREFIX}:{self.scope}:{digest}"
        return base + ":n", base + ":until"

    def retry_after(self, subject: str) -> int | None:
        """Seconds until `subject` may try again, or None if it may try now."""
        count_key, until_key = self._keys(subject)
        until = cache.get(until_key)
        if until is None or until <= now():
            return None
        if (cache.get(count_key) or 0) < self.limit:
            return None
        return max(1, math.ceil(until - now()))

    def failed(self, subject: str) -> None:
        """Count one failure of `subject` in its current window (opening a window if none is open)."""
        count_key, until_key = self._keys(subject)
        current = now()
        until = cache.get(until_key)
        if until is not None and until <= current:  # over by the clock, not yet evicted
            cache.delete_many([count_key, until_key])
        cache.add(until_key, current + self.window_s, timeout=self.window_s)  # add: first caller wins
        cache.add(count_key, 0, timeout=self.window_s)
        try:
            cache.incr(count_key)
        except ValueError:  # expired between the two calls: start again
            cache.set(count_key, 1, timeout=self.window_s)

    def reset(self, subject: str) -> None:
        cache.delete_many(list(self._keys(subject)))


def login_account() -> Limit:
    """Failed sign-ins of one account from one address (subject: `account_key(username, address)`)."""
    return Limit(
        "login-account-address",
        settings.VOLT_LOGIN_FAILURES_PER_ACCOUNT,
        settings.VOLT_AUTH_THROTTLE_WINDOW_S,
    )


def login_address() -> Limit:
    return Limit(
        "login-address", settings.VOLT_LOGIN_FAILURES_PER_ADDRESS, settings.VOLT_AUTH_THROTTLE_WINDOW_S
    )


def token_address() -> Limit:
    return Limit(
        "token-address", settings.VOLT_TOKEN_FAILURES_PER_ADDRESS, settings.VOLT_AUTH_THROTTLE_WINDOW_S
    )


def client_address(request) -> str:
    """The caller's address as the server saw it (behind a proxy, have it set REMOTE_ADDR)."""
    return (request.META.get("REMOTE_ADDR") if request is not None else None) or "unknown"


def account_key(username: str | None, address: str) -> str:
    """The subject of an account's failures from one address."""
    return f"{(username or '').strip().lower()}\n{address}"


def login_retry_after(request, username: str | None) -> int | None:
    """Seconds before this sign-in may be tried from this address (for this account, or at all), or None."""
    address = client_address(request)
    waits = [login_address().retry_after(address)]
    if username:
        waits.append(login_account().retry_after(account_key(username, address)))
    waits = [w for w in waits if w]
    return max(waits) if waits else None


def login_failed(request, username: str | None) -> None:
    address = client_address(request)
    login_address().failed(address)
    if username:
        login_account().failed(account_key(username, address))


def login_succeeded(request, username: str | None) -> None:
    if username:
        login_account().reset(account_key(username, client_address(request)))
