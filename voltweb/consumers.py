"""Websocket consumers and websocket authentication shared by every app."""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer

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
