from rest_framework.routers import DefaultRouter

from voltweb.api import views

router = DefaultRouter()
router.register("teams", views.TeamViewSet, basename="team")
router.register("tokens", views.ApiTokenViewSet, basename="token")

urlpatterns = router.urls
