from voltweb.api import views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.register("teams", views.TeamViewSet, basename="team")
router.register("tokens", views.ApiTokenViewSet, basename="token")

urlpatterns = router.urls
