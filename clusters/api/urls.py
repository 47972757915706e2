from django.urls import path

from clusters.api import measurements, quotas, recovery, telemetry, views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.include_root_view = False  # one API root (voltweb.api.urls), not three at one URL
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("clusters", telemetry.ClusterTelemetryViewSet, basename="cluster-telemetry")
router.register("clusters", recovery.ClusterRecoveryViewSet, basename="cluster-recovery")
router.register("teams", quotas.TeamQuotaViewSet, basename="team")  # /teams/{id}/quota/ (use: clusters')
router.register("bandwidth-samples", measurements.BandwidthSampleViewSet, basename="bandwidth-sample")

urlpatterns = [path("placements/preview", views.preview, name="placement-preview"), *router.urls]
