"""Create the demo's users, teams, providers and a small real inventory of `local` hosts. Idempotent."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from inventory import services
from inventory.choices import DriverKind, FabricKind, HostState, ProviderStatus
from inventory.models import Block, Host, Provider
from voltweb import services as accounts
from voltweb.choices import TeamRole

DEMO_PASSWORD = "volt-demo"

# username: (is platform admin, team slug or None, team role, provider name or None)
USERS = {
    "admin": (True, None, None, None),
    "alice": (False, "demo-lab", TeamRole.RESEARCHER, None),
    "tom": (False, "demo-lab", TeamRole.ADMIN, None),
    "bob": (False, "other-lab", TeamRole.RESEARCHER, None),
    "priya": (False, None, None, "Northwind GPU Cloud"),
    "omar": (False, None, None, "Helios Compute"),
}
TEAMS = {"demo-lab": "Demo Lab", "other-lab": "Other Lab"}

# provider -> fabrics: (site, region, fabric, kind, per-host GB/s, oversubscription, {block: [(host, model, gpus, $)]})
INVENTORY = {
    "Northwind GPU Cloud": [
        (
            "iad1",
            "us-east",
            "iad1-ib",
            FabricKind.IB_NDR,
            400.0,
            2.0,
            {
                "r01": [
                    ("iad1-h100-01", "H100", 8, "2.49"),
                    ("iad1-h100-02", "H100", 8, "2.49"),
                    ("iad1-h100-03", "H100", 8, "2.59"),
                ],
                "r02": [("iad1-h100-04", "H100", 8, "2.39"), ("iad1-a100-01", "A100", 8, "1.49")],
            },
        ),
        (
            "iad1",
            "us-east",
            "iad1-eth",
            FabricKind.ETH_100G,
            12.5,
            1.0,
            {
                "e01": [("iad1-4090-01", "RTX 4090", 4, "0.39"), ("iad1-4090-02", "RTX 4090", 4, "0.44")],
            },
        ),
    ],
    "Helios Compute": [
        (
            "ams1",
            "eu-west",
            "ams1-roce",
            FabricKind.ROCE,
            200.0,
            1.0,
            {
                "a01": [("ams1-a100-01", "A100", 8, "1.29"), ("ams1-a100-02", "A100", 8, "1.35")],
                "a02": [("ams1-h100-01", "H100", 8, "2.19")],
            },
        ),
        (
            "ams1",
            "eu-west",
            "ams1-eth",
            FabricKind.ETH_25G,
            None,
            1.0,
            {
                "b01": [("ams1-l40s-01", "L40S", 4, "0.89")],
            },
        ),
    ],
}


class Command(BaseCommand):
    help = "Seed demo users, teams, providers and local hosts (discovered for real). Safe to run twice."

    def handle(self, *args, **options):
        if not settings.VOLT_ALLOW_LOCAL_HOSTS:
            raise CommandError(
                "seed_demo adds local (simulated) hosts, which are off here: run `manage.py demo`, "
                "or set VOLT_ALLOW_LOCAL_HOSTS=1."
            )
        users = self._users()
        created = 0
        for provider_name, fabrics in INVENTORY.items():
            provider = self._provider(provider_name, users)
            for site_name, region, fabric_name, kind, bandwidth, oversub, blocks in fabrics:
                site = services.get_or_create_site(site_name, region)
                fabric = services.create_fabric(
                    provider, site, fabric_name, kind, bandwidth, oversub, list(blocks)
                )
                for block_name, hosts in blocks.items():
                    block = Block.objects.get(fabric=fabric, name=block_name)
                    for host_name, model, gpus, price in hosts:
                        created += self._host(provider, block, host_name, model, gpus, Decimal(price))
        available = Host.objects.filter(state=HostState.AVAILABLE).count()
        self.stdout.write(
            self.style.SUCCESS(f"Demo ready: {created} host(s) onboarded now, {available} available.")
        )
        self.stdout.write(f"Logins (password {DEMO_PASSWORD!r}): " + ", ".join(USERS))

    def _users(self) -> dict:
        User = get_user_model()
        teams = {slug: accounts.create_team(name, slug) for slug, name in TEAMS.items()}
        users = {}
        for username, (platform_admin, team, role, _provider) in USERS.items():
            user, made = User.objects.get_or_create(
                username=username, defaults={"email": f"{username}@volt.example"}
            )
            if made:
                user.set_password(DEMO_PASSWORD)
            user.is_staff = user.is_superuser = platform_admin
            user.save()
            if team:
                accounts.add_member(teams[team], user, role)
            users[username] = user
        return users

    def _provider(self, name: str, users: dict) -> Provider:
        admin = next(u for u, spec in USERS.items() if spec[3] == name)
        provider = Provider.objects.filter(name=name).first()
        if provider is None:
            provider = services.register_provider(users[admin], name, f"ops@{admin}.example")
        if provider.status == ProviderStatus.PENDING:
            services.review_provider(provider, approve=True)
        return provider

    def _host(self, provider, block, name, model, gpus, price) -> int:
        if Host.objects.filter(provider=provider, name=name).exists():
            return 0
        spec = services.default_local_spec(model, gpus, block.fabric.kind)
        request = services.HostRequest(
            name=name, block=block, driver=DriverKind.LOCAL, price_per_gpu_hour=price, local_spec=spec
        )
        with transaction.atomic():
            host = services.add_host(provider, request, queue=False)
        host = services.onboard_host(host.pk)
        self.stdout.write(
            f"  {host.name}: {host.get_state_display()} ({host.gpu_count} x {host.gpu_model or model})"
        )
        return 1
