"""Onboarding through a real Celery worker consuming from Redis (no eager mode)."""

import time

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from inventory.choices import HostState
from inventory.models import Host
from voltweb.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker():
    """A real worker thread on every Volt queue, fed by the Redis broker."""
    with celery_app.connection_for_write() as conn:
        for queue in settings.VOLT_QUEUES:
            conn.default_channel.queue_purge(queue)
    with start_worker(
        celery_app,
        pool="solo",
        perform_ping_check=False,
        queues=list(settings.VOLT_QUEUES),
        shutdown_timeout=20,
    ):
        yield


def wait_for_state(host_id: int, states: set[str], timeout_s: float = 60) -> Host:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host = Host.objects.get(pk=host_id)
        if host.state in states:
            return host
        time.sleep(0.2)
    raise AssertionError(f"host {host_id} still {host.state} after {timeout_s} s")


def test_host_added_through_the_api_is_onboarded_by_the_worker(
    root, northwind, northwind_ib, client_for, worker
):
    body = {
        "provider": "northwind",
        "name": "via-redis",
        "block": northwind_ib.blocks.first().pk,
        "driver": "local",
        "price_per_gpu_hour": "2.10",
        "local_spec": {"gpu_model": "H100", "gpu_count": 8},
    }
    response = client_for(root).post("/api/v1/hosts/", body, format="json")  # local hosts: platform admins
    assert response.status_code == 202

    host = wait_for_state(response.json()["id"], {HostState.AVAILABLE, HostState.FAILED})

    assert host.state == HostState.AVAILABLE and host.gpus.count() == 8


def test_broken_host_ends_failed_through_the_worker(root, northwind, northwind_ib, client_for, worker):
    from inventory import services

    request = services.HostRequest(
        name="garbled",
        block=northwind_ib.blocks.first(),
        driver="local",
        price_per_gpu_hour=1,
        local_spec=services.default_local_spec("H100", 8, "ib_ndr"),
        local_faults={"nvidia_smi_garbage": ""},
    )
    host = services.add_host(northwind, request, actor=root)

    host = wait_for_state(host.pk, {HostState.AVAILABLE, HostState.FAILED})

    assert host.state == HostState.FAILED and host.error_code == "parse_failed"
    assert not host.gpus.exists()
