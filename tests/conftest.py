"""Shared fixtures: personas (Healthchecks style) and a small topology every inventory test can use.

Personas: alice (researcher, team A "Lab A"), bob (researcher, team B "Lab B"), priya (provider admin
of Northwind), omar (provider admin of Helios), root (platform admin).
"""

from __future__ import annotations

import itertools
import uuid
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from inventory import host_runtime, services
from inventory.choices import DriverKind, FabricKind, HostState
from inventory.models import GPU, Host
from voltweb import services as accounts
from voltweb.celery import app as celery_app
from voltweb.choices import TeamRole


@pytest.fixture(autouse=True)
def _isolated_data_dir(settings, tmp_path):
    """Each test gets its own folder for local host sandboxes."""
    settings.VOLT_DATA_DIR = tmp_path / "data"
    settings.VOLT_AUTO_PROVISION = False  # provisioning tests (Ray) turn it on; placement: fake hosts
    settings.VOLT_AUTO_RECOVER = False  # recovery tests turn it on; the watch's own tests stop at DEGRADED
    settings.VOLT_LOCAL_FABRIC_EMULATION = "off"  # tests/integration/test_fabric_emulation.py turns it on


@pytest.fixture(autouse=True)
def _fresh_offers_cache():
    """Cached offers from an earlier (rolled back) test must not answer this one."""
    from django.core.cache import cache

    from inventory.capacity import CAPACITY_VERSION_KEY

    cache.set(CAPACITY_VERSION_KEY, uuid.uuid4().int >> 66, None)


@pytest.fixture(autouse=True)
def _fresh_auth_throttle(monkeypatch):
    """Failed sign-ins and token failures of an earlier test must not throttle this one."""
    from voltweb import throttle

    monkeypatch.setattr(throttle, "KEY_PREFIX", f"throttle-test-{uuid.uuid4().hex}")


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """`with committed(): ...` runs the block's on-commit hooks at its end, Celery tasks in-process.

    Unit tests run inside a transaction that never commits; integration tests use a real worker instead.
    """
    # The Django-namespaced key is the one Celery reads; `task_always_eager` alone would be ignored.
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield lambda: django_capture_on_commit_callbacks(execute=True)
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False


@pytest.fixture
def make_user(django_user_model):
    def make(username: str, **extra):
        user = django_user_model.objects.create_user(username=username, password="pw-" + username, **extra)
        return user

    return make


@pytest.fixture
def team_a(db):
    return accounts.create_team("Lab A", "lab-a")


@pytest.fixture
def team_b(db):
    return accounts.create_team("Lab B", "lab-b")


@pytest.fixture
def alice(make_user, team_a):
    user = make_user("alice")
    accounts.add_member(team_a, user, TeamRole.RESEARCHER)
    return user


@pytest.fixture
def bob(make_user, team_b):
    user = make_user("bob")
    accounts.add_member(team_b, user, TeamRole.RESEARCHER)
    return user


@pytest.fixture
def root(make_user):
    return make_user("root", is_staff=True, is_superuser=True)


@pytest.fixture
def priya(make_user):
    return make_user("priya")


@pytest.fixture
def omar(make_user):
    return make_user("omar")


@pytest.fixture
def northwind(priya):
    provider = services.register_provider(priya, "Northwind", "ops@northwind.example")
    return services.review_provider(provider, approve=True)


@pytest.fixture
def helios(omar):
    provider = services.register_provider(omar, "Helios", "ops@helios.example")
    return services.review_provider(provider, approve=True)


@pytest.fixture
def iad1(db):
    return services.get_or_create_site("iad1", "us-east")


@pytest.fixture
def ams1(db):
    return services.get_or_create_site("ams1", "eu-west")


@pytest.fixture
def northwind_ib(northwind, iad1):
    return services.create_fabric(northwind, iad1, "iad1-ib", FabricKind.IB_NDR, 400.0, 2.0, ["r01", "r02"])


@pytest.fixture
def helios_roce(helios, ams1):
    return services.create_fabric(helios, ams1, "ams1-roce", FabricKind.ROCE, 200.0, 1.0, ["a01"])


@pytest.fixture
def add_local_host():
    """Add and onboard (synchronously) a local host; faults as in inventory.drivers.local."""

    def add(
        provider, fabric, name, model="H100", gpus=8, price="2.49", block=None, faults=None, onboard=True
    ):
        block = block or fabric.blocks.order_by("name").first()
        request = services.HostRequest(
            name=name,
            block=block,
            driver=DriverKind.LOCAL,
            price_per_gpu_hour=Decimal(price),
            local_spec=services.default_local_spec(model, gpus, fabric.kind),
            local_faults=faults,
        )
        host = services.add_host(provider, request, queue=False)
        return services.onboard_host(host.pk) if onboard else host

    return add


_serial = itertools.count(1)


def ready_runtime() -> dict:
    """The runtime record of an SSH host whose runtime of Volt's pins was installed and verified."""
    path = f"{host_runtime.SYSTEM_DIR}/runtime-{host_runtime.key()}"
    return {
        "state": "ready", "ready": True, "key": host_runtime.key(), "path": path, "python": f"{path}/bin/python",
        "exists": True, "versions": host_runtime.pins(), "python_version": host_runtime.python_version(),
        "problems": [], "installed_by": "volt",
    }  # fmt: skip


@pytest.fixture
def make_host():
    """An available host with healthy GPUs (one NVLink domain unless `domains` splits them)."""

    def make(block, model="H100", gpus=8, price="2.50", name=None, domains=1, state=HostState.AVAILABLE):
        fabric = block.fabric
        number = next(_serial)
        host = Host.objects.create(
            provider=fabric.provider,
            name=name or f"{model.lower().replace(' ', '')}-{number}",
            site=fabric.site,
            fabric=fabric,
            block=block,
            driver=DriverKind.SSH,
            address=f"10.9.{number // 250}.{number % 250}",
            state=state,
            price_per_gpu_hour=Decimal(price),
            gpu_model=model,
            gpu_count=gpus,
            nvlink_domain_size=gpus // domains,
            runtime=ready_runtime(),
        )
        per_domain = gpus // domains
        GPU.objects.bulk_create(
            GPU(
                host=host,
                index=i,
                uuid=f"GPU-{number}-{i}",
                model=model,
                name=model,
                nvlink_domain=i // per_domain,
            )
            for i in range(gpus)
        )
        services.refresh_free_capacity([host.pk])
        host.refresh_from_db()
        return host

    return make


def api_client(user=None, token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    elif user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def client_for():
    """An API client authenticated with a real bearer token of `user`."""

    def make(user):
        return api_client(token=accounts.create_api_token(user, "test").secret)

    return make
