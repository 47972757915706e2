from django.urls import path
from rest_framework.routers import DefaultRouter

from clusters.api import views

router = DefaultRouter()
router.register("clusters", views.ClusterViewSet, basename="cluster")

urlpatterns = [path("placements/preview", views.preview, name="placement-preview"), *router.urls]
