from jobs.api import views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.include_root_view = False  # one API root (voltweb.api.urls)
router.register("jobs", views.JobViewSet, basename="job")

urlpatterns = router.urls
