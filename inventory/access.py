"""Who may see and change what in the inventory: providers, blocks, hosts and GPUs per user, what a host
event tells someone who does not manage the host, and which hosts placement may use.

Read-only queries; inventory.services re-exports them (the app's face).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from inventory import host_runtime
from inventory.choices import DriverKind, HostState, ProviderStatus
from inventory.models import GPU, Block, Host, HostDrill, Provider, ProviderMembership
from voltweb.services import is_platform_admin


def managed_provider_ids(user: AbstractBaseUser) -> set[int]:
    if not user.is_authenticated:
        return set()
    return set(ProviderMembership.objects.filter(user=user).values_list("provider_id", flat=True))


def managed_providers(user: AbstractBaseUser) -> QuerySet[Provider]:
    """Providers `user` acts for: their own; platform admins: all."""
    if is_platform_admin(user):
        return Provider.objects.all()
    return Provider.objects.filter(pk__in=managed_provider_ids(user))


def managed_blocks(user: AbstractBaseUser) -> QuerySet[Block]:
    """Blocks of the fabrics of the providers `user` acts for (where they may add hosts)."""
    return Block.objects.filter(fabric__provider__in=managed_providers(user)).select_related("fabric__site")


def can_manage_provider(user: AbstractBaseUser, provider: Provider) -> bool:
    return is_platform_admin(user) or provider.pk in managed_provider_ids(user)


def is_researcher(user: AbstractBaseUser) -> bool:
    return user.is_authenticated and user.memberships.exists()


def visible_providers(user: AbstractBaseUser) -> QuerySet[Provider]:
    """Platform admins see all; provider admins their own; researchers every approved provider."""
    if is_platform_admin(user):
        return Provider.objects.all()
    mine = Q(pk__in=managed_provider_ids(user))
    if is_researcher(user):
        mine |= Q(status=ProviderStatus.APPROVED)
    return Provider.objects.filter(mine)


def managed_hosts(user: AbstractBaseUser) -> QuerySet[Host]:
    """Hosts of the providers `user` acts for (platform admins: all): what a provider admin looks after."""
    return Host.objects.filter(provider__in=managed_providers(user))


def visible_hosts(user: AbstractBaseUser) -> QuerySet[Host]:
    """Provider admins see their own hosts in every state; researchers see what they could get, and the
    hosts cordoned while a fault drill they ran lasts (to see why, and to uncordon: may_act_on_host)."""
    if is_platform_admin(user):
        return Host.objects.all()
    mine = Q(provider_id__in=managed_provider_ids(user))
    if is_researcher(user):
        mine |= Q(state=HostState.AVAILABLE, provider__status=ProviderStatus.APPROVED)
        drilled = HostDrill.objects.filter(actor=user, ended_at__isnull=True).values("host_id")
        mine |= Q(state=HostState.CORDONED, pk__in=drilled)
    return Host.objects.filter(mine)


def visible_gpus(user: AbstractBaseUser) -> QuerySet[GPU]:
    """GPUs of the hosts `visible_hosts` gives, filtered through the GPU's own join.

    (A `host__in=<subquery>` form made PostgreSQL probe the subquery per GPU: 2.5x slower at 100k hosts.)
    """
    if is_platform_admin(user):
        return GPU.objects.all()
    mine = Q(host__provider_id__in=managed_provider_ids(user))
    if is_researcher(user):
        mine |= Q(host__state=HostState.AVAILABLE, host__provider__status=ProviderStatus.APPROVED)
    return GPU.objects.filter(mine)


#: What a host event may tell someone who sees the host but does not manage it (HostSerializer's view):
#: the kind and the new state, never the provider's reasons, errors or the host's address.
PUBLIC_EVENT_FIELDS = {"state": ("kind", "state")}


def host_event_for(user: AbstractBaseUser, host_id: int, event: dict) -> tuple[bool, dict | None]:
    """(may the user still see the host, the event as the user may see it or None to send nothing).

    The websocket asks this for each event and recipient, so it filters exactly as the REST API does.
    """
    host = visible_hosts(user).filter(pk=host_id).select_related("provider").first()
    if host is None:
        return False, None
    if can_manage_provider(user, host.provider):
        return True, event
    fields = PUBLIC_EVENT_FIELDS.get(event.get("kind"))
    return True, ({name: event[name] for name in fields if name in event} if fields else None)


def offerable_hosts() -> QuerySet[Host]:
    """Hosts that placement may use: available, from an approved provider, with Volt's runtime ready."""
    return Host.objects.filter(
        runtime_ready_q(), state=HostState.AVAILABLE, provider__status=ProviderStatus.APPROVED
    )


def runtime_ready_q() -> Q:
    """Local hosts (the local runtime of this machine), and SSH hosts whose recorded runtime is a ready
    one of Volt's current pins (inventory/runtimes.py installs and records it)."""
    return ~Q(driver=DriverKind.SSH) | Q(runtime__key=host_runtime.key(), runtime__ready=True)
