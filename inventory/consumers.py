"""Live host updates: state changes and discovery progress, pushed to the host page."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from inventory import services


class HostConsumer(AsyncJsonWebsocketConsumer):
    """Authenticates, authorizes (same rule as the API), sends a snapshot, then forwards events."""

    async def connect(self):
        user = self.scope.get("user")
        host_id = self.scope["url_route"]["kwargs"]["host_id"]
        snapshot = await self._snapshot(user, host_id) if user and user.is_authenticated else None
        if snapshot is None:
            await self.close(code=4404)
            return
        self.group = f"host-{host_id}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "snapshot", **snapshot})

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def volt_event(self, message):
        await self.send_json(message["event"])

    @database_sync_to_async
    def _snapshot(self, user, host_id):
        host = services.visible_hosts(user).filter(pk=host_id).first()
        if host is None:
            return None
        return {"state": host.state, "free_gpus": host.free_gpus, "gpu_count": host.gpu_count}
