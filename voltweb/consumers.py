"""Websocket consumers shared by every app."""

from channels.generic.websocket import AsyncWebsocketConsumer

NOT_FOUND_CLOSE_CODE = 4404  # the websocket echo of HTTP 404, as the host consumer uses for "not yours"


class NotFoundConsumer(AsyncWebsocketConsumer):
    """The last websocket route: an unknown path is refused cleanly (close 4404), not a server error."""

    async def connect(self):
        await self.close(code=NOT_FOUND_CLOSE_CODE)
