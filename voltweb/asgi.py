"""ASGI entry point: HTTP goes to Django, websockets to Channels consumers (session-authenticated)."""

import logging
import os

from django.core.asgi import get_asgi_application


def _leave_form_bodies_to_django() -> None:
    """Stop Twisted (daphne's HTTP server) from parsing form bodies: Django does, and answers its errors.

    Twisted's Request parses every multipart POST body into `request.args` before daphne hands the raw body
    to the application, and daphne never reads `args`. A body its parser rejects (an empty form with no
    parts, a missing boundary) was answered with a bare, body-less 400 before Volt saw the request, instead
    of the API's JSON error; and every upload was parsed twice. With the parse a no-op, Django's own parser
    (InputGuardMiddleware, the views) answers in the API's error shape. Runs where daphne loads this module.
    """
    try:
        from twisted.web import http
    except ImportError:  # not served by daphne: nothing parses before Django
        return
    if not hasattr(http, "_getMultiPartArgs"):
        logging.getLogger(__name__).warning("twisted.web.http._getMultiPartArgs is gone: forms parsed twice")
        return
    http._getMultiPartArgs = lambda content, ctype: {}


_leave_form_bodies_to_django()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "voltweb.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from voltweb.middleware import BodyLimitMiddleware  # noqa: E402
from voltweb.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
