"""`Authorization: Bearer <token>` authentication for the API, backed by hashed ApiTokens."""

from rest_framework import authentication, exceptions

from voltweb import services


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts or parts[0].lower() != self.keyword.lower():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header; expected 'Authorization: Bearer <token>'."
            )
        token = services.authenticate_token(parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed(
                "Invalid, expired or revoked token; create a new one in the console under API tokens."
            )
        return token.user, token

    def authenticate_header(self, request):
        # Makes DRF answer 401 (with WWW-Authenticate), not 403, to unauthenticated calls.
        return self.keyword
