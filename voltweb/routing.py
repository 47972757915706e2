"""Websocket routes of every app, gathered in one list; an unknown path ends in a clean 4404 close."""

from django.urls import re_path

from clusters.routing import websocket_urlpatterns as clusters_ws
from inventory.routing import websocket_urlpatterns as inventory_ws
from voltweb.consumers import NotFoundConsumer

app_websocket_urlpatterns = [*inventory_ws, *clusters_ws]

websocket_urlpatterns = [*app_websocket_urlpatterns, re_path(r"", NotFoundConsumer.as_asgi())]
