"""Live host updates: state changes and discovery progress, pushed to the host page."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model

from inventory import services

#: Close code when the caller may not (or may no longer) see the host: the page's "not found".
CLOSE_NO_ACCESS = 4404


class HostConsumer(AsyncJsonWebsocketConsumer):
    """Authenticates, authorizes (same rule as the API), sends a snapshot, then forwards events.

    Every event is re-authorized for this recipient when it arrives (the user may have lost the host:
    it left AVAILABLE, the provider was suspended, a membership ended) and shaped to what the REST API
    shows that role (`services.host_event_for`): a researcher gets the new state and nothing of the
    provider's reasons or the host's address. A recipient who lost access is disconnected.
    """

    async def connect(self):
        user = self.scope.get("user")
        self.host_id = int(self.scope["url_route"]["kwargs"]["host_id"])
        snapshot = await self._snapshot(user) if user and user.is_authenticated else None
        if snapshot is None:
            await self.close(code=CLOSE_NO_ACCESS)
            return
        self.group = f"host-{self.host_id}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "snapshot", **snapshot})

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def volt_event(self, message):
        allowed, event = await self._shaped(message["event"])
        if not allowed:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            del self.group
            await self.close(code=CLOSE_NO_ACCESS)
            return
        if event is not None:
            await self.send_json(event)

    @database_sync_to_async
    def _snapshot(self, user):
        host = services.visible_hosts(user).filter(pk=self.host_id).first()
        if host is None:
            return None
        return {"state": host.state, "free_gpus": host.free_gpus, "gpu_count": host.gpu_count}

    @database_sync_to_async
    def _shaped(self, event: dict) -> tuple[bool, dict | None]:
        # The user row is read again: a deactivated account or a lost staff flag counts from now on.
        user = get_user_model().objects.filter(pk=self.scope["user"].pk, is_active=True).first()
        if user is None:
            return False, None
        return services.host_event_for(user, self.host_id, event)
