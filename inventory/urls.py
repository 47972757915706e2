from django.urls import path

from inventory import views

app_name = "inventory"
urlpatterns = [
    path("", views.offers, name="offers"),
    path("hosts/", views.hosts, name="hosts"),
    path("hosts/<int:pk>/", views.host_detail, name="host"),
    path("hosts/<int:pk>/status/", views.host_status, name="host-status"),
    path("hosts/<int:pk>/faults/", views.host_faults, name="host-faults"),
    path("hosts/<int:pk>/runtime/", views.host_runtime, name="host-runtime"),
    path("hosts/<int:pk>/<str:action>/", views.host_action, name="host-action"),
    path("providers/", views.providers, name="providers"),
    path("providers/new/", views.provider_new, name="provider-new"),
    path("providers/<slug:slug>/", views.provider_detail, name="provider"),
    path("providers/<slug:slug>/review/", views.provider_review, name="provider-review"),
    path("providers/<slug:slug>/fabrics/new/", views.fabric_new, name="fabric-new"),
    path("providers/<slug:slug>/hosts/new/", views.host_new, name="host-new"),
]
