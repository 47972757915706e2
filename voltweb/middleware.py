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

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.template.loader import render_to_string

API_PREFIX = "/api/"
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def bad_request(request: HttpRequest, message: str, code: str = "invalid") -> HttpResponse:
    """The API's one error shape under /api/, a console 400 page elsewhere."""
    return bad_request_at(request.path, message, code)


def bad_request_at(path: str, message: str, code: str = "invalid") -> HttpResponse:
    if path.startswith(API_PREFIX):
        return JsonResponse({"error": {"code": code, "message": message}}, status=400)
    html = render_to_string("400.html", {"message": message}, request=None)
    return HttpResponse(html, status=400)


def _has_nul(raw: str) -> bool:
    return "\x00" in raw or b"\x00" in unquote_to_bytes(raw)


def body_limit(method: str, path: str, content_type: str) -> tuple[int, str]:
    """The most bytes a request body may hold, and the message refusing more: DATA_UPLOAD_MAX_MEMORY_SIZE,
    or VOLT_UPLOAD_MAX_BYTES for a multipart POST to a path that takes a job's working dir archive
    (settings.VOLT_UPLOAD_PATHS)."""
    takes_uploads = (
        method == "POST"
        and content_type == "multipart/form-data"
        and any(re.match(pattern, path) for pattern in settings.VOLT_UPLOAD_PATHS)
    )
    if not takes_uploads:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return limit, f"The request body is larger than {limit} bytes."
    return settings.VOLT_UPLOAD_MAX_BYTES, (
        f"The upload is larger than the {settings.VOLT_JOB_UPLOAD_MAX_MB} MiB a job's working directory may "
        "be (VOLT_JOB_UPLOAD_MAX_MB): leave data sets and checkpoints out of the archive and read them "
        "from the cluster's shared storage."
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
    limit, too_large = body_limit(request.method, request.path, request.content_type)
    if int(length) > limit:
        return too_large
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


class BodyLimitMiddleware:
    """ASGI: reads a request body only up to its limit (`body_limit`), whatever Content-Length says.

    Django's ASGI handler reads the whole body (to a spooled file) before any middleware runs, and a body
    sent without Content-Length (chunked) passed InputGuardMiddleware's check unseen. Past the limit this
    stops reading, tells Django the client went away (it then answers nothing) and answers the 400 itself.
    The server in front may still buffer the body (daphne's Twisted does); a proxy's body limit bounds that.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        limit, too_large = body_limit(scope.get("method", ""), scope.get("path", ""), content_type)
        received, over = 0, False

        async def bounded_receive():
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, bounded_receive, send)
        if over:
            response = await sync_to_async(bad_request_at)(scope.get("path", ""), too_large)
            await send({"type": "http.response.start", "status": response.status_code, "headers": [
                (b"content-type", response["Content-Type"].encode()),
                (b"content-length", str(len(response.content)).encode()),
                (b"x-content-type-options", b"nosniff"),
            ]})  # fmt: skip
            await send({"type": "http.response.body", "body": response.content})


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
