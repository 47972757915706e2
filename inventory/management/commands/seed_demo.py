"""Create the demo's users, teams, providers and a small real inventory of `local` hosts. Idempotent.

With `--lab N` (root; `manage.py lab up --lab N` first) the inventory is lab N's machines instead, added as
`ssh` hosts at their gates with their lab addresses as private addresses, as a provider admin would add
real machines: onboarding and Volt's runtime install run as Celery tasks, shown live on each host's page.
"""

from decimal import Decimal
from pathlib import Path

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
# The lab's default providers (inventory/lab/topology.py) as the demo's.
LAB_PROVIDERS = {"northwind": "Northwind GPU Cloud", "helios": "Helios Compute"}
LAB_PRICES = {"H100": "2.49", "A100": "1.49", "L40S": "0.89", "RTX 4090": "0.39"}

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

    def add_arguments(self, parser):
        parser.add_argument(
            "--lab", type=int, default=0,
            help="Add lab N's machines (manage.py lab up --lab N) as SSH hosts instead of local hosts.",
        )  # fmt: skip

    def handle(self, *args, lab=0, **options):
        if lab:
            return self._lab(lab)
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

    def _lab(self, number: int) -> None:
        from inventory.lab import operations

        try:
            status = operations.status(Path(settings.VOLT_LAB_DIR), number)
            record, topology = operations.read_lab(Path(settings.VOLT_LAB_DIR), number)
        except (OSError, ValueError, operations.LabError) as exc:
            raise CommandError(
                f"lab {number} is not up ({exc}): run `manage.py lab up --lab {number}` first."
            ) from None
        unknown = {m.provider for m in topology.machines} - set(LAB_PROVIDERS)
        if unknown:
            raise CommandError(
                f"the demo knows the lab providers {', '.join(LAB_PROVIDERS)}, not {', '.join(unknown)}"
            )
        users = self._users()
        fabrics = topology.declared.get("fabrics", {})
        key = status.key_path.read_text()
        queued = 0
        for machine in topology.machines:
            provider = self._provider(LAB_PROVIDERS[machine.provider], users)
            if (
                Host.objects.filter(provider=provider, name=machine.name)
                .exclude(state=HostState.RETIRED)
                .exists()
            ):
                continue
            # The provider declares what its links deliver: the lab shapes them to its topology's rates
            # times its scale, so placement's predictions and the probe's verdicts are about those rates.
            site = services.get_or_create_site(
                machine.site, machine.region, machine.backbone_gbps * record.scale
            )
            fabric = services.create_fabric(
                provider, site, machine.fabric, fabrics[machine.fabric]["kind"], machine.fabric_gbps * record.scale,
                machine.oversubscription, [machine.block],
            )  # fmt: skip
            block, _ = Block.objects.get_or_create(fabric=fabric, name=machine.block)
            seen = status.machine(machine.name)
            request = services.HostRequest(
                name=machine.name, block=block, driver=DriverKind.SSH,
                price_per_gpu_hour=Decimal(LAB_PRICES.get(machine.spec["gpu_model"], "1.00")),
                address=seen.gate, ssh_port=seen.gate_port, ssh_user=status.login_user, ssh_private_key=key,
                ssh_host_key=seen.host_key, private_address=seen.address,
                overlay_endpoint=machine.udp_endpoint,  # where a cluster spanning providers reaches it
            )  # fmt: skip
            with transaction.atomic():
                services.add_host(provider, request)  # onboarding, then the runtime install: Celery tasks
            queued += 1
            self.stdout.write(f"  {machine.name}: {seen.address} behind {seen.gate}, onboarding queued")
        self.stdout.write(self.style.SUCCESS(f"Lab {number}: {queued} machine(s) queued for onboarding."))
        self.stdout.write(f"Logins (password {DEMO_PASSWORD!r}): " + ", ".join(USERS))
