"""Clusters API: request, list, inspect, terminate; and placement preview."""

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from clusters import durations, planning, services
from clusters.api import serializers as s
from clusters.models import Cluster
from voltweb import services as accounts
from voltweb.api.errors import ErrorResponseSerializer, ServiceError

ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 404: ErrorResponseSerializer}


class ClusterViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your teams' clusters. POST requests one: placement runs in the background (202)."""

    serializer_class = s.ClusterSerializer
    filterset_fields = ["status", "team__slug"]
    ordering_fields = ["created_at", "priority"]
    queryset = Cluster.objects.none()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Cluster.objects.none()
        return (
            Cluster.objects.visible_to(self.request.user)
            .with_queue_position()
            .select_related("team", "created_by")
            .prefetch_related("nodes__host__site", "nodes__host__block", "nodes__host__provider")
        )

    @extend_schema(request=s.ClusterSpecSerializer, responses={202: s.ClusterSerializer, **ERRORS})
    def create(self, request, *args, **kwargs):
        spec = s.ClusterSpecSerializer(data=request.data, context={"request": request})
        spec.is_valid(raise_exception=True)
        try:
            cluster = services.request_cluster(
                spec.validated_data["team"], request.user, spec.spec(spec.validated_data)
            )
        except planning.InvalidSpec as exc:
            raise ServiceError("; ".join(exc.problems), code="invalid", status_code=400) from None
        return Response(s.ClusterSerializer(cluster).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.ClusterSerializer, 409: ErrorResponseSerializer})
    @action(detail=True, methods=["post"])
    def terminate(self, request, pk=None):
        """Cancel a pending or queued cluster (answers `terminated`), or terminate a running one: it answers
        `terminating` at once while a worker stops the cluster's Ray processes, removes its key and frees
        its GPUs; poll the cluster (or `volt clusters terminate --wait`) until it is `terminated`."""
        cluster = self.get_object()
        cluster = services.terminate_cluster(cluster, request.user)
        return Response(s.ClusterSerializer(cluster).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.ExtendSerializer,
        responses={200: s.ClusterSerializer, 400: ErrorResponseSerializer, 403: ErrorResponseSerializer,
                   404: ErrorResponseSerializer, 409: ErrorResponseSerializer},
    )  # fmt: skip
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Move a running cluster's end (its requested `duration_s`) `seconds` later: team members only,
        recorded on its timeline; clears the end-of-duration warning. 409 for a cluster without a duration
        or not running."""
        body = s.ExtendSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = durations.extend(self.get_object(), request.user, body.validated_data["seconds"])
        return Response(s.ClusterSerializer(cluster, context=self.get_serializer_context()).data)

    @extend_schema(
        responses={
            (200, "text/plain"): str,
            403: ErrorResponseSerializer,
            404: ErrorResponseSerializer,
            409: ErrorResponseSerializer,
        }
    )
    @action(detail=True, methods=["get"], url_path="ssh-key")
    def ssh_key(self, request, pk=None):
        """The cluster's SSH private key, for members of its team only (platform admins: 403). Download as
        volt-cluster-<id>.key, chmod 600. Each download is recorded on the cluster's timeline."""
        cluster = self.get_object()
        key = services.download_cluster_key(cluster, request.user)
        if not key:
            raise ServiceError(
                "This cluster has no key yet: it is generated when provisioning starts.",
                code="not_ready",
                status_code=409,
            )
        response = HttpResponse(key, content_type="text/plain")
        response["Content-Disposition"] = f'attachment; filename="volt-cluster-{cluster.pk}.key"'
        return response

    @extend_schema(responses={200: s.ClusterEventSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().events.select_related("actor"))
        return self.get_paginated_response(s.ClusterEventSerializer(page, many=True).data)


@extend_schema(request=s.ClusterSpecSerializer, responses={200: s.PreviewSerializer, **ERRORS})
@api_view(["POST"])
def preview(request):
    """The plan placement would make now, without allocating anything; or why nothing fits."""
    if not planning.may_request_clusters(request.user):
        raise PermissionDenied(str(planning.NoTeam()))
    spec = s.ClusterSpecSerializer(data=request.data, context={"request": request, "needs_team": False})
    spec.is_valid(raise_exception=True)
    try:
        result = planning.preview(
            spec.spec(spec.validated_data), request.user, _team_of(request, spec.validated_data)
        )
    except planning.InvalidSpec as exc:
        raise ServiceError("; ".join(exc.problems), code="invalid", status_code=400) from None
    return Response(planning.plan_as_json(result))


def _team_of(request, validated: dict):
    """The team a preview plans for: the one named, or the caller's only team (hosts serving others are out)."""
    teams = list(accounts.teams_of(request.user)[:2])
    return validated.get("team") or (teams[0] if len(teams) == 1 else None)
