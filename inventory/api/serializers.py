from decimal import Decimal

from django.core.validators import EmailValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from inventory import services, validation
from inventory.choices import DriverKind, FabricKind, GpuHealth, HostState, OnboardingError
from inventory.drivers import faults as fault_table
from inventory.gpu_catalog import BY_MODEL
from inventory.models import GPU, Block, Fabric, Host, HostEvent, NetworkPort, Provider, Site
from inventory.services import HostRequest
from voltweb.api.fields import ScopedPrimaryKeyRelatedField, ScopedSlugRelatedField


def _email_or_blank(value: str) -> None:
    """An email address, or nothing (a plain function: the schema must not say `format: email`)."""
    if value:
        EmailValidator()(value)


class ProviderSerializer(serializers.ModelSerializer):
    # Optional: "" when not given, which an OpenAPI `format: email` string would not allow.
    contact_email = serializers.CharField(
        required=False, allow_blank=True, max_length=254, validators=[_email_or_blank]
    )

    class Meta:
        model = Provider
        fields = ["id", "name", "slug", "status", "contact_email", "created_at", "reviewed_at"]
        read_only_fields = ["slug", "status", "created_at", "reviewed_at"]


class SiteSerializer(serializers.ModelSerializer):
    class Meta:
        model = Site
        fields = ["id", "name", "region", "description", "backbone_gbytes_per_s"]


class BlockSerializer(serializers.ModelSerializer):
    class Meta:
        model = Block
        fields = ["id", "name", "fabric"]


def _provider_field() -> ScopedSlugRelatedField:
    return ScopedSlugRelatedField(
        scope=services.managed_providers, noun="provider", slug_field="slug", queryset=Provider.objects.all()
    )


class FabricSerializer(serializers.ModelSerializer):
    provider = _provider_field()
    blocks = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    block_names = serializers.ListField(
        child=serializers.CharField(max_length=100),
        write_only=True,
        required=False,
        help_text="Racks / leaf switches to create in this fabric.",
    )
    per_host_gbytes_per_s = serializers.FloatField(required=False, min_value=0.01)

    class Meta:
        model = Fabric
        fields = [
            "id",
            "provider",
            "site",
            "name",
            "kind",
            "per_host_gbytes_per_s",
            "oversubscription",
            "blocks",
            "block_names",
        ]


class HostSerializer(serializers.ModelSerializer):
    """What anyone who may see a host sees. Provider admins get HostDetailSerializer."""

    provider = serializers.CharField(source="provider.slug", read_only=True)
    site = serializers.CharField(source="site.name", read_only=True)
    region = serializers.CharField(source="site.region", read_only=True)
    fabric = serializers.CharField(source="fabric.name", read_only=True)
    fabric_kind = serializers.CharField(source="fabric.kind", read_only=True)
    block = serializers.CharField(source="block.name", read_only=True)

    class Meta:
        model = Host
        fields = [
            "id",
            "name",
            "provider",
            "region",
            "site",
            "fabric",
            "fabric_kind",
            "block",
            "state",
            "gpu_model",
            "gpu_count",
            "free_gpus",
            "nvlink_domain_size",
            "price_per_gpu_hour",
            "reliability",
            "last_heartbeat_at",
        ]
        read_only_fields = fields


class DrillNoteSerializer(serializers.Serializer):
    """The fault drill that keeps a host out of service: recovery cordoned it after the drill hit it."""

    drill = serializers.CharField()
    by = serializers.CharField(source="actor_name")
    cluster = serializers.IntegerField(source="cluster_pk")
    cluster_name = serializers.CharField()
    at = serializers.DateTimeField()
    note = serializers.SerializerMethodField()

    def get_note(self, drill) -> str:
        return drill.note(self.context.get("state", "cordoned"))


class HostViewSerializer(HostSerializer):
    """One host on its own: also why it is out of service after a fault drill, and whether the caller
    may uncordon it (its provider's admins; the team admin who ran the drill, while it is the drill's)."""

    after_drill = serializers.SerializerMethodField(
        help_text="The fault drill whose failure got the host cordoned (or offline); null when none. "
        "Lifted when the drill's cluster ends."
    )
    may_uncordon = serializers.SerializerMethodField()

    @extend_schema_field(DrillNoteSerializer(allow_null=True))
    def get_after_drill(self, host: Host) -> dict | None:
        drill = services.drill_keeping_out(host)
        if drill is None:
            return None
        return DrillNoteSerializer(drill, context={"state": host.get_state_display().lower()}).data

    def get_may_uncordon(self, host: Host) -> bool:
        request = self.context.get("request")
        if request is None or host.state != HostState.CORDONED:
            return False
        return services.may_act_on_host(request.user, host, "uncordon")

    class Meta(HostSerializer.Meta):
        fields = HostSerializer.Meta.fields + ["after_drill", "may_uncordon"]
        read_only_fields = fields


class NetworkPortSerializer(serializers.ModelSerializer):
    class Meta:
        model = NetworkPort
        fields = [
            "ca",
            "port",
            "link_layer",
            "transport",
            "rate_gbps",
            "state",
            "physical_state",
            "closest_gpus",
            "gpu_link",
            "source",
        ]
        read_only_fields = fields


class HostDetailSerializer(HostViewSerializer):
    """A provider admin's view of one host: access details, errors, discovery, unhealthy GPUs, ports."""

    ports = NetworkPortSerializer(many=True, read_only=True)
    network_warnings = serializers.SerializerMethodField(
        help_text="Where discovered ports contradict the declared fabric."
    )
    gpu_problems = serializers.SerializerMethodField(
        help_text="GPUs set aside (unhealthy or lost) and why; they are never offered."
    )

    def get_network_warnings(self, host: Host) -> list[str]:
        return list((host.discovery or {}).get("network_warnings", []))

    def get_gpu_problems(self, host: Host) -> list[dict]:
        rows = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "health": g.health,
                "reason": g.health_reason,
            }
            for g in host.gpus.exclude(health=GpuHealth.HEALTHY)
        ]
        known = {g["pci_bus_id"] for g in rows}
        lost = [
            {
                "index": None,
                "uuid": "",
                "pci_bus_id": item["pci_bus_id"],
                "health": GpuHealth.LOST,
                "reason": item["message"],
            }
            for item in (host.discovery or {}).get("lost_gpus", [])
            if not any(bus.lower().endswith(item["pci_bus_id"]) for bus in known if bus)
        ]
        return rows + lost

    # "" while the host has no error: the schema must allow the blank besides the codes.
    error_code = serializers.ChoiceField(choices=OnboardingError.choices, allow_blank=True, read_only=True)

    class Meta(HostViewSerializer.Meta):
        fields = HostViewSerializer.Meta.fields + [
            "gpu_memory_mib",
            "gpu_problems",
            "ports",
            "network_warnings",
            "discovered_gbytes_per_s",
            "driver",
            "address",
            "ssh_port",
            "ssh_user",
            "ssh_host_key",
            "private_address",
            "overlay_endpoint",
            "local_spec",
            "error_code",
            "error_message",
            "discovery",
            "system",
            "runtime",
            "created_at",
        ]
        read_only_fields = fields


class LocalSpecSerializer(serializers.Serializer):
    gpu_model = serializers.ChoiceField(choices=list(BY_MODEL))
    gpu_count = serializers.IntegerField(min_value=1, max_value=16)
    nvlink = serializers.BooleanField(required=False)
    nics = serializers.ListField(
        child=serializers.DictField(), required=False, validators=[validation.validate_nics]
    )


class HostCreateSerializer(serializers.Serializer):
    """Adding a host: name, where it sits (block), how to reach it, and its price."""

    provider = _provider_field()
    name = serializers.SlugField(max_length=100)
    block = ScopedPrimaryKeyRelatedField(
        scope=services.managed_blocks, noun="block", queryset=Block.objects.select_related("fabric__site")
    )
    driver = serializers.ChoiceField(choices=DriverKind.choices)
    price_per_gpu_hour = serializers.DecimalField(max_digits=8, decimal_places=2, min_value=Decimal("0"))
    address = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        validators=[validation.validate_address],
    )
    ssh_port = serializers.IntegerField(min_value=1, max_value=65535, required=False, default=22)
    ssh_user = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        validators=[validation.validate_ssh_user],
    )
    ssh_private_key = serializers.CharField(
        required=False, allow_blank=True, write_only=True, validators=[validation.validate_private_key]
    )
    ssh_host_key = serializers.CharField(
        required=False, allow_blank=True, validators=[validation.validate_host_key]
    )
    private_address = serializers.IPAddressField(
        protocol="IPv4",
        required=False,
        allow_null=True,
        help_text="SSH hosts: the address the provider's other hosts reach this one at, when it is not "
        "`address` (a gateway, NAT). Ray, the probe and collectives use it.",
    )
    overlay_endpoint = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=270,
        validators=[validation.validate_udp_endpoint],
        help_text="SSH hosts behind NAT: the public ADDRESS:PORT your provider forwards to the host's UDP port "
        "51820 (a cluster's WireGuard overlay). Blank: none; clusters across networks then relay through a "
        "node that has one.",
    )
    local_spec = LocalSpecSerializer(required=False)

    def validate(self, attrs):
        if attrs["driver"] == DriverKind.LOCAL and not attrs.get("local_spec"):
            raise serializers.ValidationError(
                {"local_spec": "Local hosts need a spec: gpu_model and gpu_count."}
            )
        if attrs["driver"] == DriverKind.SSH and not attrs.get("address"):
            raise serializers.ValidationError({"address": "SSH hosts need an address (IP or DNS name)."})
        return attrs

    def to_request(self) -> HostRequest:
        data = dict(self.validated_data)
        data.pop("provider")
        return HostRequest(**data)


class HostActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class HostFaultSerializer(serializers.Serializer):
    """A fault to inject into (POST) or clear from (DELETE) a local host; `value` where it takes one
    (`throttled`: % of one CPU, `link_degraded`: % of the link rate, `gpu_lost`: GPU indices...)."""

    fault = serializers.ChoiceField(choices=[f.name for f in fault_table.CATALOG if not f.at_creation_only])
    value = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class HostFaultsSerializer(serializers.Serializer):
    faults = serializers.DictField(child=serializers.CharField(allow_blank=True))
    links_emulated = serializers.BooleanField()
    links_note = serializers.CharField(allow_blank=True)


class HostEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None, read_only=True, allow_null=True)

    class Meta:
        model = HostEvent
        fields = ["id", "at", "kind", "from_state", "to_state", "message", "actor"]


class GpuSerializer(serializers.ModelSerializer):
    host_name = serializers.CharField(source="host.name", read_only=True)

    class Meta:
        model = GPU
        fields = [
            "id",
            "host",
            "host_name",
            "index",
            "uuid",
            "model",
            "name",
            "memory_mib",
            "nvlink_domain",
            "pci_bus_id",
            "health",
            "health_reason",
            "temperature_c",
            "utilization_pct",
            "ecc_uncorrectable",
        ]
        read_only_fields = fields


class OfferSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(help_text='Precise model: "A100-80GB", "H100-SXM", "L40S".')
    memory_gib = serializers.IntegerField(allow_null=True, help_text="Memory of one GPU (GiB).")
    region = serializers.CharField()
    fabric_kind = serializers.ChoiceField(choices=FabricKind.choices)
    free_gpus = serializers.IntegerField()
    total_gpus = serializers.IntegerField()
    hosts = serializers.IntegerField()
    hosts_with_free_gpus = serializers.IntegerField()
    max_free_gpus_per_host = serializers.IntegerField()
    min_price_per_gpu_hour = serializers.DecimalField(max_digits=8, decimal_places=2)
    max_price_per_gpu_hour = serializers.DecimalField(max_digits=8, decimal_places=2)
