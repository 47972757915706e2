from rest_framework.routers import DefaultRouter

from inventory.api import views

router = DefaultRouter()
router.register("providers", views.ProviderViewSet, basename="provider")
router.register("sites", views.SiteViewSet, basename="site")
router.register("fabrics", views.FabricViewSet, basename="fabric")
router.register("blocks", views.BlockViewSet, basename="block")
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("offers", views.OfferViewSet, basename="offer")

urlpatterns = router.urls
