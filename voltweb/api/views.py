"""Account API: your teams and your API tokens."""

from django.views.decorators.debug import sensitive_variables
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from voltweb import services
from voltweb.api.errors import ErrorResponseSerializer, ServiceError
from voltweb.api.serializers import ApiTokenSerializer, IssuedTokenSerializer, TeamSerializer
from voltweb.models import ApiToken


class TeamViewSet(viewsets.ReadOnlyModelViewSet):
    """Teams you belong to (platform admins: all). Another team is a 404."""

    serializer_class = TeamSerializer

    def get_queryset(self):
        return (
            services.teams_of(self.request.user).select_related("quota").prefetch_related("memberships__user")
        )


class ApiTokenViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your API tokens. POST creates one and returns its secret once; POST .../revoke/ revokes it."""

    serializer_class = ApiTokenSerializer

    queryset = ApiToken.objects.none()  # for the schema generator; requests use get_queryset()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(
        request=ApiTokenSerializer,
        responses={201: IssuedTokenSerializer, 400: ErrorResponseSerializer, 403: ErrorResponseSerializer},
    )
    @sensitive_variables("issued", "data")
    def create(self, request, *args, **kwargs):
        """Create a token (signed-in session only: a bearer token cannot mint tokens, which would outlive
        its own revocation). It expires at `expires_at`, or after the default lifetime (90 days)."""
        if isinstance(request.auth, ApiToken):
            raise ServiceError(
                "API tokens are created from a signed-in console session (API tokens page), not with "
                "another token.",
                code="session_required",
                status_code=403,
            )
        serializer = ApiTokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = services.create_api_token(
            request.user, serializer.validated_data["name"], serializer.validated_data.get("expires_at")
        )
        data = IssuedTokenSerializer(issued.token).data | {"token": issued.secret}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ApiTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = services.revoke_api_token(self.get_object())
        return Response(ApiTokenSerializer(token).data)
