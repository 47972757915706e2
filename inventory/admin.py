from django.contrib import admin

from inventory.models import GPU, Block, Fabric, Host, HostEvent, Provider, ProviderMembership, Site


class ProviderMembershipInline(admin.TabularInline):
    model = ProviderMembership
    extra = 0


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "created_at", "reviewed_at")
    list_filter = ("status",)
    inlines = [ProviderMembershipInline]


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("name", "region", "backbone_gbytes_per_s")


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ("name", "site", "provider", "kind", "per_host_gbytes_per_s", "oversubscription")


@admin.register(Block)
class BlockAdmin(admin.ModelAdmin):
    list_display = ("name", "fabric")


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "provider",
        "site",
        "state",
        "gpu_model",
        "gpu_count",
        "free_gpus",
        "price_per_gpu_hour",
    )
    list_filter = ("state", "driver", "gpu_model")
    search_fields = ("name", "address")
    readonly_fields = ("ssh_private_key_encrypted", "discovery")


@admin.register(GPU)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("host", "index", "model", "health", "nvlink_domain")
    list_filter = ("model", "health")


@admin.register(HostEvent)
class HostEventAdmin(admin.ModelAdmin):
    list_display = ("host", "at", "kind", "from_state", "to_state", "message")
