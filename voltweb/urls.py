from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

from voltweb import views

api_v1 = [
    path("", include("voltweb.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("clusters.api.urls")),
    path("", include("jobs.api.urls")),
]

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="inventory:offers", permanent=False), name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/tokens/", views.tokens, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", views.revoke_token, name="token-revoke"),
    path("teams/", views.teams, name="teams"),
    path("teams/<int:pk>/quota/", views.team_quota, name="team-quota"),
    path("inventory/", include("inventory.urls")),
    path("clusters/", include("clusters.urls")),
    path("", include("jobs.urls")),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    # Last: any other /api/ URL answers the API's JSON 404, not an HTML page.
    re_path(r"^api/", views.api_not_found, name="api-not-found"),
]

# The console's own error pages (with DEBUG on, voltweb.errors.ErrorPagesMiddleware shows them too).
handler403 = "voltweb.errors.permission_denied"
handler404 = "voltweb.errors.not_found"
handler500 = "voltweb.errors.server_error"
