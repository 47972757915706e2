"""The cluster page's websocket: authenticate, authorize by team (as the API does), snapshot, forward."""

from __future__ import annotations

import asyncio
import random
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from clusters import live, services
from clusters.live_views import overview_snapshot
from voltweb import realtime
from voltweb import services as accounts
from voltweb.consumers import NOT_FOUND_CLOSE_CODE, scope_identity

# Same answer for "no such cluster", "not yours", "not signed in" and "no longer yours" (a member removed,
# an account deactivated, the socket's API token revoked or expired): nothing leaks.
REFUSED = NOT_FOUND_CLOSE_CODE


class ClusterConsumer(AsyncJsonWebsocketConsumer):
    """One cluster's live events, for members of its team (session cookie or API bearer token)."""

    token_id: int | None = None  # the API token the socket was opened with (None: a session)

    async def connect(self):
        self.cluster_id = self.scope["url_route"]["kwargs"]["cluster_id"]
        self.user, self.token_id = await database_sync_to_async(scope_identity)(self.scope)
        snapshot = await self._snapshot() if self.user is not None else None
        if snapshot is None:
            await self.close(code=REFUSED)
            return
        self.group = f"cluster-{self.cluster_id}"
        self.checked_at = time.monotonic()
        self.recheck_s = settings.VOLT_WS_RECHECK_S * random.uniform(0.5, 1.0)
        self.rechecking = None
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def dispatch(self, message):
        """Events skip Channels' per-message database clean-up: AsyncConsumer.dispatch runs
        close_old_connections on the one thread-sensitive sync thread before every handler, so an event to
        1,000 sockets queued 1,000 thread hops in a row (most of bench/realtime.py's latency). This path
        touches no database; the recheck goes through database_sync_to_async, which cleans up itself."""
        if message["type"] == "volt.event":
            await self.volt_event(message)
        else:
            await super().dispatch(message)

    async def volt_event(self, message):
        """Forward an event: the text the broadcaster encoded once for every socket, no database access
        on this path. Access is re-checked beside it, at most every VOLT_WS_RECHECK_S (jittered, so sockets
        that connected together do not all query at one event): the user, the team membership and the API
        token the socket was opened with; who lost any of them is closed then."""
        if "text" in message:
            await self.send(text_data=message["text"])
        else:
            await self.send_json(message["event"])
        if time.monotonic() - self.checked_at > self.recheck_s and self.rechecking is None:
            self.rechecking = asyncio.ensure_future(self._recheck())

    async def _recheck(self):
        try:
            allowed = await self._still_allowed()
        finally:
            self.checked_at = time.monotonic()
            self.rechecking = None
        if not allowed:
            await self.close(code=REFUSED)

    async def receive_json(self, content, **kwargs):
        """`{"kind": "snapshot"}` asks for a fresh snapshot (a client that fell behind catches up)."""
        if isinstance(content, dict) and content.get("kind") == "snapshot":
            snapshot = await self._snapshot()
            if snapshot is None:
                await self.close(code=REFUSED)
            else:
                await self.send_json(snapshot)

    @database_sync_to_async
    def _snapshot(self):
        # Read afresh (a requested snapshot too): the account and the socket's token must still be good.
        user = accounts.socket_user(self.user.pk, self.token_id)
        cluster = services.visible_clusters(user).filter(pk=self.cluster_id).first() if user else None
        return live.snapshot(cluster) if cluster is not None else None

    @database_sync_to_async
    def _still_allowed(self) -> bool:
        # By primary key: the session's user is a lazy wrapper (UserLazyObject) whose type has no manager.
        user = accounts.socket_user(self.user.pk, self.token_id)
        return user is not None and services.visible_clusters(user).filter(pk=self.cluster_id).exists()


class OverviewConsumer(AsyncJsonWebsocketConsumer):
    """The health overview, live: counts of the user's teams' clusters and the hosts they may see, and
    for provider admins the health of their own hosts. Any signed-in user (session or API token).

    Changes arrive as data-less `changed` events on one group; each socket recomputes its own user's
    view (what it may see differs per user), at most once per REFRESH_S, coalescing bursts (a sweep of
    many clusters). The user, its memberships and provider roles, and the API token the socket was opened
    with are read afresh at every recompute: a deactivated account or a revoked or expired token closes it."""

    REFRESH_S = 1.0
    token_id: int | None = None

    async def connect(self):
        self.user, self.token_id = await database_sync_to_async(scope_identity)(self.scope)
        if self.user is None:
            await self.close(code=REFUSED)
            return
        self.pending = None
        await self.channel_layer.group_add(realtime.OVERVIEW_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self._send_view()

    async def disconnect(self, code):
        if getattr(self, "joined", False):
            await self.channel_layer.group_discard(realtime.OVERVIEW_GROUP, self.channel_name)
        if getattr(self, "pending", None) is not None:
            self.pending.cancel()

    async def dispatch(self, message):
        if message["type"] == "volt.event":  # no database here: see ClusterConsumer.dispatch
            await self.volt_event(message)
        else:
            await super().dispatch(message)

    async def volt_event(self, message):
        if self.pending is None:  # a refresh already queued covers this change too
            self.pending = asyncio.ensure_future(self._refresh_soon())

    async def _refresh_soon(self):
        await asyncio.sleep(self.REFRESH_S)
        self.pending = None
        await self._send_view()

    async def _send_view(self):
        view = await self._view()
        if view is None:
            await self.close(code=REFUSED)
            return
        await self.send_json(view)

    @database_sync_to_async
    def _view(self):
        user = accounts.socket_user(self.user.pk, self.token_id)
        return overview_snapshot(user) if user is not None else None
