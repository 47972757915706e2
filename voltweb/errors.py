"""The console's own 404/403/500 pages, in production and with DEBUG on (the demo runs with DEBUG).

Without DEBUG, Django calls the handlers below (voltweb/urls.py names them). With DEBUG, Django would
show its technical pages instead (tracebacks, URL lists) — not what a demo visitor should meet — so
`ErrorPagesMiddleware` answers with the same pages and still logs a server error's traceback to the
console output. API paths keep their JSON errors (voltweb/api/errors.py shape).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template import loader

logger = logging.getLogger("django.request")


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def _page(request: HttpRequest | None, template: str, status: int, code: str, message: str) -> HttpResponse:
    if request is not None and _is_api(request):
        return JsonResponse({"error": {"code": code, "message": message}}, status=status)
    html = loader.get_template(template).render({"path": request.path if request else ""}, request)
    return HttpResponse(html, status=status)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page(request, "404.html", 404, "not_found", "Not found.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page(request, "403.html", 403, "permission_denied", "You may not do this.")


def server_error(request: HttpRequest | None = None) -> HttpResponse:
    if request is not None and _is_api(request):
        return JsonResponse({"error": {"code": "server_error", "message": "Server error."}}, status=500)
    # Rendered without the request (no context processors, no database): the failure may lie there.
    return HttpResponse(loader.get_template("500.html").render({}), status=500)


class ErrorPagesMiddleware:
    """With DEBUG on, console errors get the console's pages instead of Django's technical ones."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # No URL matched: Django answered with its URL list. (A view's own 404 has resolver_match set.)
        if settings.DEBUG and response.status_code == 404 and request.resolver_match is None:
            return not_found(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not settings.DEBUG or _is_api(request):
            return None  # production: Django calls the handlers above; API: DRF's handler already ran
        if isinstance(exception, Http404):
            return not_found(request, exception)
        if isinstance(exception, PermissionDenied):
            return permission_denied(request, exception)
        logger.error(
            "Internal Server Error: %s", request.path, exc_info=exception, extra={"request": request}
        )
        return server_error(request)
