"""How callers prove who they are: bearer tokens for the API, passwords for the console, both throttled.

`Authorization: Bearer <token>` is backed by hashed ApiTokens. A valid token is accepted first, whatever
others did from the same address; failures are counted per address (voltweb/throttle.py) and past the limit
a failed attempt is answered 429 with Retry-After, in the API's error shape, instead of 401.
"""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.views.decorators.debug import sensitive_variables
from rest_framework import authentication, exceptions

from voltweb import services, throttle

UserModel = get_user_model()


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts or parts[0].lower() != self.keyword.lower():
            return None
        # The token first: a valid one is never refused because other callers behind the same address
        # failed (tokens are 256-bit random, so what the counter stops is load, not a feasible guess).
        token = services.authenticate_token(parts[1]) if len(parts) == 2 else None
        if token is not None:
            return token.user, token
        address = throttle.client_address(request)
        limit = throttle.token_address()
        wait = limit.retry_after(address)
        if wait:
            raise exceptions.Throttled(
                wait, detail=f"Too many failed token authentications from your address; retry in {wait} s."
            )
        limit.failed(address)
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header; expected 'Authorization: Bearer <token>'."
            )
        raise exceptions.AuthenticationFailed(
            "Invalid, expired or revoked token; create a new one in the console under API tokens."
        )

    def authenticate_header(self, request):
        # Makes DRF answer 401 (with WWW-Authenticate), not 403, to unauthenticated calls.
        return self.keyword


class ThrottledModelBackend(ModelBackend):
    """Django's username/password backend, refusing while the address, or the account from this address,
    is throttled.

    Every sign-in path (console, Django admin) goes through `authenticate()`, so each is counted.
    A refusal raises PermissionDenied, which ends authentication without trying the password.
    """

    @sensitive_variables("password", "kwargs")
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(UserModel.USERNAME_FIELD)
        if throttle.login_retry_after(request, username):
            raise PermissionDenied("too many failed sign-ins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            throttle.login_failed(request, username)
        else:
            throttle.login_succeeded(request, username)
        return user
