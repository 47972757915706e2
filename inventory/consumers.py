"""Live host updates: state changes and discovery progress, pushed to the host page."""

from __future__ import annotations

from channels.db import database_sync_to_async

from inventory import services
from voltweb.consumers import VoltConsumer


class HostConsumer(VoltConsumer):
    """Authenticates (session or API token), authorizes (same rule as the API), sends a snapshot, then
    forwards events.

    Every event is re-authorized for this recipient when it arrives (the user may have lost the host:
    it left AVAILABLE, the provider was suspended, a membership ended) and shaped to what the REST API
    shows that role (`services.host_event_for`): a researcher gets the new state and nothing of the
    provider's reasons or the host's address. A recipient who lost access is disconnected.
    """

    async def connect(self):
        self.host_id = int(self.scope["url_route"]["kwargs"]["host_id"])
        await super().connect()

    def group_for(self) -> str:
        return f"host-{self.host_id}"

    def snapshot(self, user) -> dict | None:
        host = services.visible_hosts(user).filter(pk=self.host_id).first()
        if host is None:
            return None
        return {
            "kind": "snapshot",
            "state": host.state,
            "free_gpus": host.free_gpus,
            "gpu_count": host.gpu_count,
        }

    async def volt_event(self, message):
        allowed, event = await self._shaped(message["event"])
        if not allowed:
            await self.refuse()
        elif event is not None:
            await self.send_json(event)

    @database_sync_to_async
    def _shaped(self, event: dict) -> tuple[bool, dict | None]:
        # The user row (and the socket's token) read again: a deactivated account counts from now on.
        user = self.current_user()
        if user is None:
            return False, None
        return services.host_event_for(user, self.host_id, event)
