from django.utils import timezone
from rest_framework import serializers

from voltweb.models import ApiToken, Membership, Team


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "joined_at"]


class TeamSerializer(serializers.ModelSerializer):
    members = MembershipSerializer(source="memberships", many=True, read_only=True)

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "created_at", "members"]


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
                "help_text": "When the token stops working; empty: after the default lifetime (90 days)."
            }
        }

    def validate_expires_at(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Give a time in the future (or leave empty for the default).")
        return value


class IssuedTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret. Shown once: store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = ApiTokenSerializer.Meta.fields + ["token"]
