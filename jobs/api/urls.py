from django.urls import path

from jobs.api import goodput, views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.include_root_view = False  # one API root (voltweb.api.urls)
router.register("jobs", views.JobViewSet, basename="job")
router.register("goodput", goodput.GoodputClusterViewSet, basename="goodput")

urlpatterns = [path("goodput/", goodput.GoodputView.as_view(), name="goodput-list"), *router.urls]
