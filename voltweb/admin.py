from django.contrib import admin

from voltweb.models import ApiToken, Membership, Team, TeamQuota


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class TeamQuotaInline(admin.StackedInline):
    """The team's quota, read-only: changes go through the Teams page or the API (set_team_quota), which
    audit them and drain the queue; an edit here would do neither."""

    model = TeamQuota
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "max_gpus",
        "gpu_model_caps",
        "gpu_hours_per_month",
        "updated_at",
        "updated_by",
    )
    verbose_name = verbose_name_plural = (
        "quota (change it on the console's Teams page or with PUT /api/v1/teams/<id>/quota/)"
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "created_at")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline, TeamQuotaInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "token_hash")
