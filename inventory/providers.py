"""Providers and their topology: registration and review, provider admins, sites, fabrics and blocks.

inventory.services re-exports these (the app's face).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from inventory import transitions
from inventory.choices import ProviderStatus
from inventory.models import Block, Fabric, Provider, ProviderMembership, Site

# --- providers ---------------------------------------------------------------------------------------


@transaction.atomic
def register_provider(user: AbstractBaseUser, name: str, contact_email: str = "") -> Provider:
    """A provider admin registers an organisation; it waits for a platform admin's approval."""
    slug = slugify(name)
    if not slug:
        raise ValidationError({"name": "Use letters or digits in the name."})
    if Provider.objects.filter(Q(name__iexact=name) | Q(slug=slug)).exists():
        raise ValidationError({"name": f"A provider named {name!r} already exists."})
    provider = Provider.objects.create(name=name, slug=slug, contact_email=contact_email)
    ProviderMembership.objects.create(provider=provider, user=user)
    return provider


def review_provider(provider: Provider, approve: bool) -> Provider:
    target = ProviderStatus.APPROVED if approve else ProviderStatus.SUSPENDED
    return transitions.transition_provider(provider, target, extra={"reviewed_at": timezone.now()})


def add_provider_admin(provider: Provider, user: AbstractBaseUser) -> None:
    ProviderMembership.objects.get_or_create(provider=provider, user=user)


# --- topology ----------------------------------------------------------------------------------------


def get_or_create_site(name: str, region: str, backbone_gbytes_per_s: float = 12.5) -> Site:
    site, _ = Site.objects.get_or_create(
        name=name, defaults={"region": region, "backbone_gbytes_per_s": backbone_gbytes_per_s}
    )
    return site


def create_fabric(
    provider: Provider,
    site: Site,
    name: str,
    kind: str,
    per_host_gbytes_per_s: float | None = None,
    oversubscription: float = 1.0,
    blocks: list[str] | None = None,
) -> Fabric:
    with transaction.atomic():
        fabric, _ = Fabric.objects.get_or_create(
            provider=provider,
            site=site,
            name=name,
            defaults={
                "kind": kind,
                "per_host_gbytes_per_s": per_host_gbytes_per_s or 0,
                "oversubscription": oversubscription,
            },
        )
        for block_name in blocks or []:
            Block.objects.get_or_create(fabric=fabric, name=block_name)
    return fabric
