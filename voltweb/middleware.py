"""Request hygiene shared by the console and the API: input that can only be an attack or a mistake is
a 400 before any view runs, and every HTML page carries a Content-Security-Policy.

One place instead of per-field patches: a NUL byte reaches PostgreSQL as a 500 ("string literal cannot
contain NUL") from whichever field or filter it lands in, and a non-ASCII Authorization header breaks
header parsing, so both are refused here for every URL.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import unquote_to_bytes

from django.conf import settings
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.template.loader import render_to_string

API_PREFIX = "/api/"
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def bad_request(request: HttpRequest, message: str, code: str = "invalid") -> HttpResponse:
    """The API's one error shape under /api/, a console 400 page elsewhere."""
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"error": {"code": code, "message": message}}, status=400)
    html = render_to_string("400.html", {"message": message}, request=None)
    return HttpResponse(html, status=400)


def _has_nul(raw: str) -> bool:
    return "\x00" in raw or b"\x00" in unquote_to_bytes(raw)


def _takes_uploads(request: HttpRequest) -> bool:
    """A multipart POST to a path that accepts a job's working dir archive (settings.VOLT_UPLOAD_PATHS)."""
    return (
        request.method == "POST"
        and request.content_type == "multipart/form-data"
        and any(re.match(pattern, request.path) for pattern in settings.VOLT_UPLOAD_PATHS)
    )


def input_problem(request: HttpRequest) -> str | None:
    """Why this request cannot be served, or None. Looks only at what every view would otherwise trip on."""
    if _has_nul(request.path) or _has_nul(request.META.get("QUERY_STRING", "")):
        return "The URL contains a NUL byte (%00); remove it."
    auth = request.META.get("HTTP_AUTHORIZATION")
    if auth is not None and not (auth.isascii() and auth.isprintable() and auth.strip()):
        return "The Authorization header must be 'Bearer <token>' in printable ASCII."
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not length.isdigit():
        return "The Content-Length header is not a number."
    if int(length) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        if not _takes_uploads(request):
            return f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
        if int(length) > settings.VOLT_UPLOAD_MAX_BYTES:
            return (
                f"The upload is larger than the {settings.VOLT_JOB_UPLOAD_MAX_MB} MiB a job's working "
                "directory may be (VOLT_JOB_UPLOAD_MAX_MB): leave data sets and checkpoints out of the "
                "archive and read them from the cluster's shared storage."
            )
    if request.method == "POST" and request.content_type in _FORM_TYPES:
        try:
            values = [v for _, vs in request.POST.lists() for v in vs] + list(request.POST.keys())
        except (MultiPartParserError, BadRequest, SuspiciousOperation) as exc:
            return f"The form body could not be parsed: {exc}"
        if any("\x00" in v for v in values if isinstance(v, str)):
            return "A form field contains a NUL byte; remove it."
    return None


class InputGuardMiddleware:
    """Refuses NUL bytes in the URL and form fields, malformed Authorization headers and oversized bodies.

    JSON bodies are checked by voltweb.api.parsers.StrictJSONParser (NUL, depth, size) when DRF parses them.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = input_problem(request)
        if problem:
            return bad_request(request, problem)
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """Adds a nonce-based Content-Security-Policy to every HTML response.

    Scripts run only from this origin or from <script nonce="{{ request.csp_nonce }}"> blocks; styles may
    be inline because Plotly and htmx inject style elements. Websockets go to this origin only.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.csp_nonce = secrets.token_urlsafe(16)
        response = self.get_response(request)
        if "text/html" in response.get("Content-Type", "") and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy(request)
        return response


def policy(request: HttpRequest) -> str:
    scheme = "wss" if request.is_secure() else "ws"
    host = request.get_host()
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src 'self' 'nonce-{request.csp_nonce}'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data: blob:",
            "font-src 'self' data:",
            f"connect-src 'self' {scheme}://{host}",
            "worker-src 'self' blob:",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )
