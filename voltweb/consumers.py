"""Websocket consumers and websocket authentication shared by every app.

`VoltConsumer` is the one base: authentication (session cookie or API bearer token), the close code for
"no access" (the same for "no such thing", "not yours", "not signed in" and "no longer yours": nothing
leaks), joining and leaving the group, the snapshot on connect, and the periodic access re-check while
events flow. Each consumer declares its group and its access rule (`snapshot`, `allowed`).
"""

from __future__ import annotations

import asyncio
import random
import time
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings

from voltweb import services as accounts

NOT_FOUND_CLOSE_CODE = 4404  # the websocket echo of HTTP 404, as the host consumer uses for "not yours"


class NotFoundConsumer(AsyncWebsocketConsumer):
    """The last websocket route: an unknown path is refused cleanly (close 4404), not a server error."""

    async def connect(self):
        await self.close(code=NOT_FOUND_CLOSE_CODE)


def scope_identity(scope) -> tuple[object | None, int | None]:
    """(user, token id) a socket acts for: the session user (no token), else the owner of a valid bearer
    token (header or `?token=`) and that token's id, else (None, None). Sync: run it off the event loop.

    The token id is kept so that the socket's periodic re-check (voltweb.services.socket_user) ends it
    once the token is revoked or expires, as the API would refuse its next request."""
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return user, None
    secret = _bearer(scope)
    token = accounts.authenticate_token(secret) if secret else None
    return (token.user, token.pk) if token is not None else (None, None)


def _bearer(scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == "bearer":
                return parts[1]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get("token") or [""])[0]


class VoltConsumer(AsyncJsonWebsocketConsumer):
    """A page's live events for whoever may see them (session or API token), refused with one close code.

    Subclasses set `group_for()` and the sync access rule: `snapshot(user)` (what the page gets on
    connect; None refuses) and `allowed(user)` (the periodic re-check; default: a snapshot exists). The
    user row and the socket's API token are read afresh for both (`accounts.socket_user`): a deactivated
    account, a revoked or expired token, a lost membership close the socket.
    """

    REFUSED = NOT_FOUND_CLOSE_CODE
    user = None
    token_id: int | None = None  # the API token the socket was opened with (None: a session)
    group: str | None = None

    def group_for(self) -> str:
        raise NotImplementedError

    def snapshot(self, user) -> dict | None:
        raise NotImplementedError

    def allowed(self, user) -> bool:
        return self.snapshot(user) is not None

    # --- connect, leave ---

    async def connect(self):
        self.user, self.token_id = await database_sync_to_async(scope_identity)(self.scope)
        snapshot = await self.fresh_snapshot() if self.user is not None else None
        if snapshot is None:
            await self.close(code=self.REFUSED)
            return
        self.checked_at = time.monotonic()
        self.recheck_s = settings.VOLT_WS_RECHECK_S * random.uniform(0.5, 1.0)  # sockets opened together
        self.rechecking = None  # do not all query at one event
        self.group = self.group_for()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code):
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None

    async def refuse(self):
        """Close for "no (longer) access", leaving the group first."""
        await self.disconnect(self.REFUSED)
        await self.close(code=self.REFUSED)

    def current_user(self):
        """The socket's user read afresh, or None once the account or the socket's token is no good."""
        return accounts.socket_user(self.user.pk, self.token_id) if self.user is not None else None

    @database_sync_to_async
    def fresh_snapshot(self) -> dict | None:
        user = self.current_user()
        return self.snapshot(user) if user is not None else None

    @database_sync_to_async
    def still_allowed(self) -> bool:
        user = self.current_user()
        return user is not None and self.allowed(user)

    # --- events ---

    async def dispatch(self, message):
        """Events skip Channels' per-message database clean-up: AsyncConsumer.dispatch runs
        close_old_connections on the one thread-sensitive sync thread before every handler, so an event to
        1,000 sockets queued 1,000 thread hops in a row (most of bench/realtime.py's latency). The event path
        touches no database; the re-check goes through database_sync_to_async, which cleans up itself."""
        if message["type"] == "volt.event":
            await self.volt_event(message)
        else:
            await super().dispatch(message)

    async def volt_event(self, message):
        """Forward an event (the text the broadcaster encoded once for every socket), and re-check access
        beside it at most every VOLT_WS_RECHECK_S (jittered); who lost it is closed then."""
        if "text" in message:
            await self.send(text_data=message["text"])
        else:
            await self.send_json(message["event"])
        self.recheck_soon()

    def recheck_soon(self) -> None:
        if time.monotonic() - self.checked_at > self.recheck_s and self.rechecking is None:
            self.rechecking = asyncio.ensure_future(self._recheck())

    async def _recheck(self):
        try:
            allowed = await self.still_allowed()
        finally:
            self.checked_at = time.monotonic()
            self.rechecking = None
        if not allowed:
            await self.refuse()
