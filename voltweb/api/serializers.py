from rest_framework import serializers

from voltweb import services
from voltweb.models import ApiToken, Membership, Team, TeamQuota


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "joined_at"]


class TeamQuotaLimitsSerializer(serializers.ModelSerializer):
    class Meta:
        model = TeamQuota
        fields = ["max_gpus", "gpu_model_caps", "gpu_hours_per_month"]


class TeamSerializer(serializers.ModelSerializer):
    members = MembershipSerializer(source="memberships", many=True, read_only=True)
    quota = TeamQuotaLimitsSerializer(
        read_only=True,
        allow_null=True,
        help_text="The team's limits (null: none set); use against them: GET /api/v1/teams/{id}/quota/.",
    )

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "created_at", "members", "quota"]


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "last_used_at",
            "expires_at",
            "revoked_at",
            "is_active",
        ]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at", "is_active"]
        extra_kwargs = {
            "expires_at": {
                "help_text": "When the token stops working, at most the default lifetime ahead "
                "(VOLT_TOKEN_LIFETIME_DAYS, 90 days); empty: after that lifetime."
            }
        }

    def validate_expires_at(self, value):
        if value is not None:
            try:
                services.check_token_expiry(value)
            except services.TokenExpiryRefused as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value


class IssuedTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret. Shown once: store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = ApiTokenSerializer.Meta.fields + ["token"]
