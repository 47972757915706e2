"""Websocket routes of every app, gathered in one list."""

from clusters.routing import websocket_urlpatterns as clusters_ws
from inventory.routing import websocket_urlpatterns as inventory_ws

websocket_urlpatterns = [*inventory_ws, *clusters_ws]
