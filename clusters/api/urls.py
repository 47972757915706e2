from django.urls import path
from rest_framework.routers import DefaultRouter

from clusters.api import telemetry, views

router = DefaultRouter()
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("clusters", telemetry.ClusterTelemetryViewSet, basename="cluster-telemetry")

urlpatterns = [path("placements/preview", views.preview, name="placement-preview"), *router.urls]
