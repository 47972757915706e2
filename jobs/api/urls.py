from jobs.api import goodput, views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.include_root_view = False  # one API root (voltweb.api.urls)
router.register("jobs", views.JobViewSet, basename="job")
router.register("goodput", goodput.GoodputViewSet, basename="goodput")

urlpatterns = router.urls
