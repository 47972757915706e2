from inventory.api import views
from voltweb.api.routers import VoltRouter

router = VoltRouter()
router.include_root_view = False  # one API root (voltweb.api.urls), not three at one URL
router.register("providers", views.ProviderViewSet, basename="provider")
router.register("sites", views.SiteViewSet, basename="site")
router.register("fabrics", views.FabricViewSet, basename="fabric")
router.register("blocks", views.BlockViewSet, basename="block")
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("offers", views.OfferViewSet, basename="offer")

urlpatterns = router.urls
