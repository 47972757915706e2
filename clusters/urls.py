from django.urls import path

from clusters import live_views, views

app_name = "clusters"
urlpatterns = [
    path("", views.cluster_list, name="list"),
    path("new/", views.cluster_new, name="new"),
    path("preview/", views.cluster_preview, name="preview"),
    path("<int:pk>/", views.cluster_detail, name="detail"),
    path("<int:pk>/terminate/", views.cluster_terminate, name="terminate"),
    path("<int:pk>/extend/", views.cluster_extend, name="extend"),
    path("<int:pk>/probe/", live_views.cluster_probe, name="probe"),
    path("<int:pk>/drills/", views.cluster_drill, name="drill"),
    path("overview/", live_views.overview, name="overview"),
]
