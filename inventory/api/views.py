"""Inventory API: providers, sites, fabrics, hosts, GPUs and aggregated offers."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from inventory import runtimes, services
from inventory.api import serializers as s
from inventory.drivers import faults as fault_table
from inventory.drivers.base import DriverError
from inventory.filters import GpuFilter, HostFilter, OfferFilter
from inventory.models import Block, Fabric, Host, Site
from voltweb.api.errors import ErrorResponseSerializer
from voltweb.services import is_platform_admin

ERRORS = {400: ErrorResponseSerializer, 401: ErrorResponseSerializer, 404: ErrorResponseSerializer}
# One host: its provider's view (HostDetail) or everyone else's (HostView, which HostDetail extends).
# anyOf, not oneOf: a HostDetail body is a valid HostView too.
HOST_AS_SEEN = {
    "anyOf": [{"$ref": "#/components/schemas/HostDetail"}, {"$ref": "#/components/schemas/HostView"}]
}


def _django_to_drf(exc: DjangoValidationError) -> ValidationError:
    return ValidationError(getattr(exc, "message_dict", None) or {"non_field_errors": exc.messages})


class ProviderViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Providers you may see. POST registers a new provider (pending until a platform admin approves)."""

    serializer_class = s.ProviderSerializer
    lookup_field = "slug"
    filterset_fields = ["status"]

    def get_queryset(self):
        return services.visible_providers(self.request.user)

    def perform_create(self, serializer):
        try:
            serializer.instance = services.register_provider(
                self.request.user,
                serializer.validated_data["name"],
                serializer.validated_data.get("contact_email", ""),
            )
        except DjangoValidationError as exc:
            raise _django_to_drf(exc) from None

    @extend_schema(request=None, responses={200: s.ProviderSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def approve(self, request, slug=None):
        return self._review(True)

    @extend_schema(request=None, responses={200: s.ProviderSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def suspend(self, request, slug=None):
        return self._review(False)

    def _review(self, approve: bool):
        provider = self.get_object()
        if not is_platform_admin(self.request.user):
            raise PermissionDenied("Only platform admins approve or suspend providers.")
        services.review_provider(provider, approve)
        return Response(s.ProviderSerializer(provider).data)


class SiteViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Data centers. Provider admins and platform admins may add one."""

    serializer_class = s.SiteSerializer
    queryset = Site.objects.all()
    filterset_fields = ["region"]

    def perform_create(self, serializer):
        if not (is_platform_admin(self.request.user) or services.managed_provider_ids(self.request.user)):
            raise PermissionDenied("Only provider admins and platform admins add sites.")
        serializer.save()


class FabricViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Interconnect fabrics (with their blocks). Provider admins create fabrics for their provider."""

    serializer_class = s.FabricSerializer
    filterset_fields = ["site", "kind"]

    def get_queryset(self):
        providers = services.visible_providers(self.request.user)
        return (
            Fabric.objects.filter(provider__in=providers)
            .select_related("site", "provider")
            .prefetch_related("blocks")
        )

    def perform_create(self, serializer):
        data = serializer.validated_data
        if not services.can_manage_provider(self.request.user, data["provider"]):
            raise NotFound("No such provider among yours.")
        try:
            serializer.instance = services.create_fabric(
                data["provider"],
                data["site"],
                data["name"],
                data["kind"],
                data.get("per_host_gbytes_per_s"),
                data.get("oversubscription", 1.0),
                data.get("block_names", []),
            )
        except DjangoValidationError as exc:
            raise _django_to_drf(exc) from None


class BlockViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.BlockSerializer
    filterset_fields = ["fabric"]

    def get_queryset(self):
        return Block.objects.filter(fabric__provider__in=services.visible_providers(self.request.user))


@method_decorator(sensitive_post_parameters("ssh_private_key"), name="dispatch")
class HostViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Hosts you may see, filterable. POST adds a host and queues its onboarding (202)."""

    filterset_class = HostFilter
    ordering_fields = ["price_per_gpu_hour", "free_gpus", "name", "reliability", "created_at"]
    ordering = ["price_per_gpu_hour", "id"]

    def get_queryset(self):
        return services.visible_hosts(self.request.user).select_related("provider", "site", "fabric", "block")

    def get_serializer_class(self):
        if self.action == "create":
            return s.HostCreateSerializer
        if self.action in ("retrieve",) + tuple(services.HOST_ACTIONS):
            return s.HostDetailSerializer
        return s.HostSerializer

    @extend_schema(
        description="A host. Its provider's admins (and platform admins) also get access details and errors. "
        "`after_drill` says when a fault drill got it cordoned; `may_uncordon` whether you may lift that.",
        responses={200: HOST_AS_SEEN},
    )
    def retrieve(self, request, *args, **kwargs):
        return Response(self._shown(self.get_object()))

    def _manages(self, host: Host) -> bool:
        return services.can_manage_provider(self.request.user, host.provider)

    def _shown(self, host: Host) -> dict:
        """The host as the caller may see it: its provider's view, or the public one."""
        serializer = s.HostDetailSerializer if self._manages(host) else s.HostViewSerializer
        return serializer(host, context={"request": self.request}).data

    @extend_schema(
        request=s.HostCreateSerializer,
        responses={
            202: s.HostDetailSerializer,
            403: ErrorResponseSerializer,
            409: ErrorResponseSerializer,
            **ERRORS,
        },
    )
    @sensitive_variables("serializer")
    def create(self, request, *args, **kwargs):
        serializer = s.HostCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        provider = serializer.validated_data["provider"]
        if not services.can_manage_provider(request.user, provider):
            raise NotFound("No such provider among yours.")
        try:
            host = services.add_host(provider, serializer.to_request(), actor=request.user)
        except DjangoValidationError as exc:
            raise _django_to_drf(exc) from None
        return Response(s.HostDetailSerializer(host).data, status=status.HTTP_202_ACCEPTED)

    def _act(self, request, pk, action_name):
        host = self.get_object()
        if not services.may_act_on_host(request.user, host, action_name):
            raise NotFound("No such host among your provider's hosts.")
        body = s.HostActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        host = services.act_on_host(host, action_name, request.user, body.validated_data.get("reason", ""))
        return Response(self._shown(host), status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=s.HostActionSerializer, responses={202: s.HostDetailSerializer, 409: ErrorResponseSerializer}
    )
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        return self._act(request, pk, "drain")

    @extend_schema(
        request=s.HostActionSerializer, responses={202: s.HostDetailSerializer, 409: ErrorResponseSerializer}
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        return self._act(request, pk, "cordon")

    @extend_schema(
        description="Back in service. Its provider's admins (who get HostDetail's fields too); also the team "
        "admin whose fault drill got it cordoned, while that cordon is the drill's.",
        request=s.HostActionSerializer,
        responses={202: s.HostViewSerializer, 409: ErrorResponseSerializer},
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        return self._act(request, pk, "uncordon")

    @extend_schema(
        request=s.HostActionSerializer, responses={202: s.HostDetailSerializer, 409: ErrorResponseSerializer}
    )
    @action(detail=True, methods=["post"])
    def retire(self, request, pk=None):
        return self._act(request, pk, "retire")

    @extend_schema(
        request=s.HostActionSerializer, responses={202: s.HostDetailSerializer, 409: ErrorResponseSerializer}
    )
    @action(detail=True, methods=["post"])
    def rediscover(self, request, pk=None):
        return self._act(request, pk, "rediscover")

    @extend_schema(
        description="Install Volt's runtime on an SSH host, or verify the one there (202: a worker does it; "
        "`runtime.state` and `runtime.step` follow it). A host joins the offers once its runtime is ready.",
        request=None,
        responses={202: s.HostDetailSerializer, 409: ErrorResponseSerializer},
    )
    @action(detail=True, methods=["post"])
    def runtime(self, request, pk=None):
        host = self.get_object()
        if not self._manages(host):
            raise NotFound("No such host among your provider's hosts.")
        host = runtimes.queue_install(host, actor=request.user)
        return Response(self._shown(host), status=status.HTTP_202_ACCEPTED)

    @extend_schema(methods=["get"], request=None, responses={200: s.HostFaultsSerializer, **ERRORS})
    @extend_schema(
        methods=["post", "delete"],
        request=s.HostFaultSerializer,
        responses={200: s.HostFaultsSerializer, **ERRORS},
    )
    @action(detail=True, methods=["get", "post", "delete"])
    def faults(self, request, pk=None):
        """A local host's injected faults: GET lists, POST injects `fault` (with `value`), DELETE clears it."""
        host = self.get_object()
        if not self._manages(host):
            raise NotFound("No such host among your provider's hosts.")
        if request.method != "GET":
            body = s.HostFaultSerializer(data=request.data or request.query_params)
            body.is_valid(raise_exception=True)
            fault, value = body.validated_data["fault"], body.validated_data["value"]
            try:
                if request.method == "POST":
                    services.inject_fault(host, fault, value, actor=request.user)
                else:
                    services.clear_host_fault(host, fault, actor=request.user)
            except fault_table.FaultValueRefused as exc:
                raise ValidationError({"value": [str(exc)]}) from None
            except (ValueError, DriverError) as exc:
                raise ValidationError({"fault": str(exc)}) from None
        note = services.unavailable_reason() or ""
        return Response(
            {"faults": services.active_faults(host), "links_emulated": not note, "links_note": note}
        )

    @extend_schema(responses={200: s.HostEventSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        host = self.get_object()
        if not self._manages(host):
            raise NotFound("No such host among your provider's hosts.")
        page = self.paginate_queryset(services.host_history(host))
        return self.get_paginated_response(s.HostEventSerializer(page, many=True).data)


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """GPUs of the hosts you may see."""

    serializer_class = s.GpuSerializer
    filterset_class = GpuFilter
    ordering_fields = ["host", "index", "model"]
    ordering = ["host_id", "index"]

    def get_queryset(self):
        return services.visible_gpus(self.request.user).select_related("host")


class OfferViewSet(viewsets.GenericViewSet):
    """Free capacity by GPU model x region x fabric kind: what a researcher could get now."""

    serializer_class = s.OfferSerializer
    filterset_class = OfferFilter
    ordering = None

    def get_queryset(self):
        return services.visible_hosts(self.request.user)

    def list(self, request):
        hosts = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(services.cached_offers(hosts, request.user, request.GET.urlencode()))
        return self.get_paginated_response(s.OfferSerializer(page, many=True).data)
