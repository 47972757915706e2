"""The cluster page's and the overview's websockets (voltweb.consumers.VoltConsumer: authentication, the
close code, the group, the re-check): each says which group it follows and who may see it."""

from __future__ import annotations

import asyncio

from clusters import live
from clusters.live_views import overview_snapshot
from clusters.models import Cluster
from voltweb import realtime
from voltweb.consumers import VoltConsumer


class ClusterConsumer(VoltConsumer):
    """One cluster's live events, for members of its team (session cookie or API bearer token)."""

    async def connect(self):
        self.cluster_id = self.scope["url_route"]["kwargs"]["cluster_id"]
        await super().connect()

    def group_for(self) -> str:
        return f"cluster-{self.cluster_id}"

    def snapshot(self, user) -> dict | None:
        cluster = Cluster.objects.visible_to(user).filter(pk=self.cluster_id).first()
        return live.snapshot(cluster) if cluster is not None else None

    def allowed(self, user) -> bool:
        return Cluster.objects.visible_to(user).filter(pk=self.cluster_id).exists()

    async def receive_json(self, content, **kwargs):
        """`{"kind": "snapshot"}` asks for a fresh snapshot (a client that fell behind catches up)."""
        if isinstance(content, dict) and content.get("kind") == "snapshot":
            snapshot = await self.fresh_snapshot()
            if snapshot is None:
                await self.refuse()
            else:
                await self.send_json(snapshot)


class OverviewConsumer(VoltConsumer):
    """The health overview, live: counts of the user's teams' clusters and the hosts they may see, and
    for provider admins the health of their own hosts. Any signed-in user (session or API token).

    Changes arrive as data-less `changed` events on one group; each socket recomputes its own user's
    view (what it may see differs per user), at most once per REFRESH_S, coalescing bursts (a sweep of
    many clusters). The user, its memberships and provider roles, and the API token the socket was opened
    with are read afresh at every recompute: a deactivated account or a revoked or expired token closes it."""

    REFRESH_S = 1.0
    pending = None

    def group_for(self) -> str:
        return realtime.OVERVIEW_GROUP

    def snapshot(self, user) -> dict | None:
        return overview_snapshot(user)

    async def disconnect(self, code):
        await super().disconnect(code)
        if self.pending is not None:
            self.pending.cancel()

    async def volt_event(self, message):
        if self.pending is None:  # a refresh already queued covers this change too
            self.pending = asyncio.ensure_future(self._refresh_soon())

    async def _refresh_soon(self):
        await asyncio.sleep(self.REFRESH_S)
        self.pending = None
        view = await self.fresh_snapshot()  # the user and the token read afresh: a lost one closes it
        if view is None:
            await self.refuse()
        else:
            await self.send_json(view)
