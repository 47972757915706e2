from django.urls import path

from clusters import consumers

websocket_urlpatterns = [
    path("ws/clusters/<int:cluster_id>/", consumers.ClusterConsumer.as_asgi()),
    path("ws/overview/", consumers.OverviewConsumer.as_asgi()),
]
