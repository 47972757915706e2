from django.urls import path

from inventory import consumers

websocket_urlpatterns = [path("ws/hosts/<int:host_id>/", consumers.HostConsumer.as_asgi())]
