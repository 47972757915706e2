"""Inventory: who offers GPUs (providers), where they sit (site > fabric > block > host) and the GPUs."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from inventory.choices import (
    DEFAULT_HOST_BANDWIDTH_GBYTES,
    DriverKind,
    FabricKind,
    GpuHealth,
    HostEventKind,
    HostState,
    OnboardingError,
    PortTransport,
    ProviderStatus,
)


class Provider(models.Model):
    """An organisation offering hosts. Its hosts are offered only once a platform admin approves it."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    status = models.CharField(max_length=20, choices=ProviderStatus.choices, default=ProviderStatus.PENDING)
    contact_email = models.EmailField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    admins = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="ProviderMembership", related_name="provider_orgs"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProviderMembership(models.Model):
    """A provider admin: may onboard, drain, cordon and retire the provider's hosts."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_memberships"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "user"], name="provider_member_unique")]

    def __str__(self) -> str:
        return f"{self.user} admin of {self.provider}"


class Site(models.Model):
    """A data center in a region. Sites are shared: several providers may rent space in one."""

    name = models.CharField(max_length=100, unique=True, help_text="Data center code, e.g. iad1.")
    region = models.CharField(max_length=50, db_index=True, help_text="e.g. us-east, eu-west.")
    description = models.CharField(max_length=200, blank=True)
    backbone_gbytes_per_s = models.FloatField(
        default=12.5, validators=[MinValueValidator(0.01)], help_text="Bandwidth between fabrics (GB/s)."
    )

    class Meta:
        ordering = ["region", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.region})"


class Fabric(models.Model):
    """One interconnect domain inside a site (an InfiniBand subnet, a RoCE or Ethernet network)."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="fabrics")
    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="fabrics")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=FabricKind.choices)
    per_host_gbytes_per_s = models.FloatField(
        validators=[MinValueValidator(0.01)], help_text="Injection bandwidth per host (GB/s)."
    )
    oversubscription = models.FloatField(
        default=1.0, validators=[MinValueValidator(1.0)], help_text="Leaf-to-spine ratio, 1.0 = non-blocking."
    )

    class Meta:
        ordering = ["site__name", "name"]
        # Per provider: two providers may each name a fabric "ib0" in a shared data center, and neither
        # learns of the other's fabrics from an error.
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "site", "name"], name="fabric_unique_name_per_provider_site"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def save(self, *args, **kwargs):
        if not self.per_host_gbytes_per_s:
            self.per_host_gbytes_per_s = DEFAULT_HOST_BANDWIDTH_GBYTES[FabricKind(self.kind)]
        super().save(*args, **kwargs)


class Block(models.Model):
    """A rack or leaf switch within a fabric: hosts in one block talk at full fabric bandwidth."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="blocks")
    name = models.CharField(max_length=100)

    class Meta:
        ordering = ["fabric__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["fabric", "name"], name="block_unique_name_per_fabric")
        ]

    def __str__(self) -> str:
        return self.name


class Host(models.Model):
    """A provider machine. GPU model and counts are denormalised here so offers stay fast at scale."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="hosts")
    name = models.CharField(max_length=100)
    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="hosts")
    fabric = models.ForeignKey(Fabric, on_delete=models.PROTECT, related_name="hosts")
    block = models.ForeignKey(Block, on_delete=models.PROTECT, related_name="hosts")
    driver = models.CharField(max_length=10, choices=DriverKind.choices)
    address = models.CharField(max_length=255, help_text="IP or DNS name; 127.0.0.N for local hosts.")
    ssh_port = models.PositiveIntegerField(default=22, validators=[MaxValueValidator(65535)])
    private_address = models.GenericIPAddressField(
        protocol="IPv4", null=True, blank=True,
        help_text="The address the provider's other hosts reach this one at (Ray, the probe, collectives), when "
        "it is not the address Volt connects to over SSH (a gateway, NAT). Blank: the same address.",
    )  # fmt: skip
    overlay_endpoint = models.CharField(
        max_length=270, blank=True,
        help_text="SSH hosts behind NAT: the public ADDRESS:PORT the provider forwards to this host's UDP port "
        "51820, where a cluster's WireGuard overlay reaches it from other networks. Blank: none is forwarded.",
    )  # fmt: skip
    ssh_user = models.CharField(max_length=64, blank=True)
    ssh_private_key_encrypted = models.TextField(blank=True, help_text="Fernet-encrypted OpenSSH key.")
    ssh_host_key = models.TextField(blank=True, help_text="Pinned public host key line.")
    local_spec = models.JSONField(default=dict, blank=True, help_text="Declared hardware of a local host.")
    state = models.CharField(
        max_length=20, choices=HostState.choices, default=HostState.ONBOARDING, db_index=True
    )
    price_per_gpu_hour = models.DecimalField(
        max_digits=8, decimal_places=2, validators=[MinValueValidator(Decimal("0.00"))]
    )
    reliability = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of recent health checks passed (0..1).",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    gpu_model = models.CharField(max_length=50, blank=True, db_index=True)
    gpu_count = models.PositiveIntegerField(default=0)
    free_gpus = models.PositiveIntegerField(default=0, help_text="Healthy GPUs not allocated to a cluster.")
    free_gpu_map = models.JSONField(
        default=list, blank=True, help_text="Free GPU indices per NVLink domain, e.g. [[0, 1, 2, 3], [6]]."
    )
    nvlink_domain_size = models.PositiveIntegerField(
        default=0, help_text="Largest NVLink domain of healthy GPUs (GPUs)."
    )
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True, help_text="Memory of one GPU (MiB).")
    pcie_topology = models.JSONField(
        default=dict,
        blank=True,
        help_text='GPU indices per PCIe switch and per NUMA node, from topo -m: {"switches": [[0, 1]], '
        '"numa": [[0, 1, 2, 3]]}. Placement uses it on hosts without NVLink.',
    )
    discovered_gbytes_per_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Per-host injection bandwidth its ports give (up ports carrying its fabric's traffic: count x "
        "rate, GB/s), from discovery; empty when no port was seen. Placement predicts from the smaller of this "
        "and the fabric's declared per-host figure.",
    )
    error_code = models.CharField(max_length=30, choices=OnboardingError.choices, blank=True)
    error_message = models.TextField(blank=True)
    discovery = models.JSONField(default=dict, blank=True, help_text="Last discovery result.")
    system = models.JSONField(
        default=dict,
        blank=True,
        help_text='What the host runs, from the last discovery: {"os", "os_id", "kernel", "arch", "pythons": '
        '[{"path", "version"}], "driver_version", "cuda_version", "user", "privilege": root|sudo|none}.',
    )
    runtime = models.JSONField(
        default=dict,
        blank=True,
        help_text='Volt\'s runtime on the host (SSH hosts; inventory/host_runtime.py): {"state": '
        'installing|ready|failed|waiting, "step", "message", "key", "path", "python", "versions", '
        '"python_version", "problems", "installed_by": volt|provider, "ready", "took_s", "checked_at"}.',
    )
    onboarding_started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["provider__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="host_unique_name_per_provider"),
            # Per provider: a global rule would tell one provider that another has a host at an address.
            models.UniqueConstraint(
                fields=["provider", "driver", "address", "ssh_port"],
                name="host_unique_address_per_provider",
                condition=~models.Q(state=HostState.RETIRED),
            ),
            # A local host's loopback address is this machine's: Volt assigns it, one host per address.
            models.UniqueConstraint(
                fields=["address"],
                name="local_host_unique_address",
                condition=models.Q(driver="local") & ~models.Q(state=HostState.RETIRED),
            ),
            models.CheckConstraint(
                condition=models.Q(free_gpus__lte=models.F("gpu_count")), name="host_free_le_total"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "gpu_model", "free_gpus"], name="host_offer_idx"),
            models.Index(fields=["state", "price_per_gpu_hour"], name="host_price_idx"),
            # The API's `?model=` filter is case-insensitive (UPPER(gpu_model) = UPPER(%s)): this index serves
            # it in the list's price order, gives the planner statistics on UPPER(gpu_model) (a partial index
            # would not), and covers the pagination COUNT(*) index-only. bench/inventory.py, 100k hosts:
            # ?model=A100&interconnect=roce&page=3 p50 129 -> 30 ms, ?model=H100&region=..&... 90 -> 52 ms.
            # Trailing key columns, not INCLUDE: SQLite (the embedded demo) warns about INCLUDE on every command.
            models.Index(
                models.F("state"),
                models.functions.Upper("gpu_model"),
                models.F("price_per_gpu_hour"),
                models.F("id"),
                models.F("gpu_model"),
                models.F("gpu_count"),
                models.F("free_gpus"),
                models.F("site"),
                models.F("fabric"),
                models.F("provider"),
                name="host_state_model_price_idx",
            ),
            # A provider admin's host list, in the API's default order (price, id): no sort of all their hosts.
            models.Index(fields=["provider", "price_per_gpu_hour", "id"], name="host_provider_price_idx"),
            # The same order when visible_hosts ORs "my provider's hosts" with "available hosts" (a provider admin
            # who also rents GPUs): walk hosts by price and stop at the page, instead of sorting ~70,000 rows.
            models.Index(fields=["price_per_gpu_hour", "id"], name="host_price_id_idx"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def node_ip(self) -> str:
        """The address a Ray node, the probe and a job's collectives bind and advertise on this host."""
        return self.private_address or self.address


class HostReach(models.Model):
    """A check that `peer` opened a TCP connection to `host` at `address` (its node address), made from the
    peer itself (inventory/reachability.py): who reaches whom directly is recorded, not assumed."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="reached_by")
    peer = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="reaches")
    address = models.CharField(max_length=255)
    ok = models.BooleanField()
    detail = models.CharField(max_length=300, blank=True, help_text="What the peer saw when it failed.")
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["host_id", "peer_id"]
        constraints = [models.UniqueConstraint(fields=["host", "peer"], name="host_reach_unique_pair")]

    def __str__(self) -> str:
        return f"{self.peer_id} -> {self.host_id} at {self.address}: {'ok' if self.ok else 'no'}"


class GPU(models.Model):
    """One GPU of a host, as discovered. Allocation to clusters lives in the clusters app."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64)
    model = models.CharField(max_length=50)
    name = models.CharField(max_length=100, help_text="As nvidia-smi prints it.")
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    nvlink_domain = models.PositiveSmallIntegerField(default=0)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    health = models.CharField(max_length=20, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    health_reason = models.CharField(
        max_length=300, blank=True, help_text="Why the GPU is not healthy (ECC errors, heat, lost)."
    )
    temperature_c = models.IntegerField(null=True, blank=True)
    utilization_pct = models.IntegerField(null=True, blank=True)
    ecc_uncorrectable = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["host_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host"),
            models.UniqueConstraint(fields=["uuid"], name="gpu_unique_uuid"),
        ]
        indexes = [
            # `?model=` on GPUs (UPPER(model) = UPPER(%s)) probed per visible host, index-only (model included).
            models.Index(
                models.F("host"),
                models.functions.Upper("model"),
                models.F("model"),
                name="gpu_host_model_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}/gpu{self.index} ({self.model})"


class NetworkPort(models.Model):
    """One port of a host's RDMA-capable NIC as discovered (ibstat, or /sys/class/infiniband)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="ports")
    ca = models.CharField(max_length=64, help_text="Channel adapter, e.g. mlx5_0.")
    port = models.PositiveSmallIntegerField()
    link_layer = models.CharField(max_length=20, help_text="InfiniBand or Ethernet, as the NIC reports it.")
    transport = models.CharField(max_length=20, choices=PortTransport.choices)
    rate_gbps = models.PositiveIntegerField(help_text="Signalling rate (Gb/s).")
    state = models.CharField(max_length=20, help_text="Active, Down, Init, ...")
    physical_state = models.CharField(max_length=20, blank=True, help_text="LinkUp, Disabled, Polling, ...")
    closest_gpus = models.JSONField(
        default=list, blank=True, help_text="GPU indices nearest the NIC (topo -m)."
    )
    gpu_link = models.CharField(max_length=8, blank=True, help_text="PCIe link to those GPUs: PIX, PXB, ...")
    source = models.CharField(max_length=10, help_text="ibstat or sysfs.")

    class Meta:
        ordering = ["host_id", "ca", "port"]
        constraints = [models.UniqueConstraint(fields=["host", "ca", "port"], name="port_unique_per_host")]

    def __str__(self) -> str:
        return f"{self.host_id}/{self.ca}:{self.port}"

    @property
    def is_up(self) -> bool:
        return self.state == "Active"


class HostEvent(models.Model):
    """A line of a host's history: state changes, discovery results, errors, health checks."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=20, choices=HostEventKind.choices)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # A state change a fault drill caused (recovery cordoned the host after a drill hit it): undone when
    # the drill's cluster ends (inventory.drill_effects).
    drill = models.ForeignKey("HostDrill", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.host_id} {self.kind} {self.at:%Y-%m-%d %H:%M}"


class HostDrill(models.Model):
    """A fault drill run on a host for a cluster, and what it left there until that cluster ends.

    The clusters app writes one row per drill before it touches the host (clusters/drills.py). It records
    what the drill did, so only that is undone when the cluster ends: the fault file it injected
    (`fault_held`: not a fault the host already had, which stays) and, through the cordon's HostEvent
    (`HostEvent.drill`), a cordon recovery put on the host because of it. Inventory does not import the
    clusters app: the cluster is named by its id and name.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="drills")
    cluster_pk = models.PositiveIntegerField(db_index=True, help_text="The cluster's id (clusters app).")
    cluster_name = models.CharField(max_length=100)
    team = models.ForeignKey("voltweb.Team", null=True, on_delete=models.SET_NULL, related_name="+")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    drill = models.CharField(max_length=30, help_text="kill_processes or a fault of the fault table.")
    fault = models.CharField(max_length=30, blank=True, help_text="The fault file it injected, if any.")
    value = models.CharField(max_length=20, blank=True)
    fault_held = models.BooleanField(
        default=False,
        help_text="The fault file is this drill's to take back (the host did not have the fault already).",
    )
    at = models.DateTimeField(default=timezone.now)
    fault_cleared_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="Its cluster ended and what the drill left was undone."
    )

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.drill} on {self.host_id} for cluster {self.cluster_pk}"

    @property
    def actor_name(self) -> str:
        return self.actor.get_username() if self.actor is not None else "a deleted user"

    def note(self, state: str) -> str:
        """What a page says of the host being `state` (cordoned, offline) because of this drill."""
        return (
            f"{state} after a fault drill by {self.actor_name} on cluster {self.cluster_pk} "
            f"({self.cluster_name}): {self.drill}"
        )
