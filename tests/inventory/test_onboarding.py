"""Onboarding through the local driver: the real simulator, parsers and state machine run."""

import pytest

from inventory import services
from inventory.choices import HostEventKind, HostState
from inventory.drivers.local import set_fault
from inventory.models import GPU, Host
from voltweb.statemachine import IllegalTransition

pytestmark = pytest.mark.django_db


def test_healthy_h100_host_becomes_available_with_its_gpus(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "iad1-h100-01")

    assert host.state == HostState.AVAILABLE
    assert (host.gpu_model, host.gpu_count, host.free_gpus, host.nvlink_domain_size) == ("H100", 8, 8, 8)
    gpus = list(host.gpus.all())
    assert [g.index for g in gpus] == list(range(8))
    assert {g.model for g in gpus} == {"H100"} and {g.nvlink_domain for g in gpus} == {0}
    assert all(g.memory_mib == 81559 for g in gpus)
    assert len({g.uuid for g in gpus}) == 8
    assert [p["rate_gbps"] for p in host.discovery["ib_ports"]] == [400] * 8
    assert host.address.startswith("127.0.") and host.address != "127.0.0.1"


def test_consumer_gpus_get_one_nvlink_domain_each(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "rtx-01", model="RTX 4090", gpus=2, price="0.39")

    assert host.state == HostState.AVAILABLE
    assert sorted(host.gpus.values_list("nvlink_domain", flat=True)) == [0, 1]
    assert host.nvlink_domain_size == 1
    assert list(host.gpus.values_list("ecc_uncorrectable", flat=True)) == [None, None]


def test_each_local_host_gets_its_own_loopback_address(northwind, northwind_ib, add_local_host):
    a = add_local_host(northwind, northwind_ib, "a", onboard=False)
    b = add_local_host(northwind, northwind_ib, "b", onboard=False)
    assert a.address != b.address


@pytest.mark.parametrize(
    ("faults", "code", "words"),
    [
        ({"nvidia_smi_missing": ""}, "nvidia_smi_missing", "nvidia-smi is not installed"),
        ({"nvidia_smi_garbage": ""}, "parse_failed", "cannot read"),
        ({"unreachable": ""}, "unreachable", "not answering"),
        ({"gpu_lost": "3"}, "gpu_unhealthy", "Unable to determine the device handle"),
        ({"ecc_uncorrectable": "1"}, "gpu_unhealthy", "uncorrectable ECC"),
        ({"hot": "2"}, "gpu_unhealthy", "96 C"),
    ],
)
def test_broken_host_fails_with_specific_error_and_no_gpus(
    northwind, northwind_ib, add_local_host, faults, code, words
):
    host = add_local_host(northwind, northwind_ib, "broken", faults=faults)

    assert host.state == HostState.FAILED
    assert host.error_code == code
    assert words in host.error_message
    assert not GPU.objects.filter(host=host).exists()
    assert host.free_gpus == 0
    assert host.events.filter(kind=HostEventKind.ERROR, message__contains=words).exists()


def test_failed_host_is_never_offered(alice, northwind, northwind_ib, add_local_host):
    add_local_host(northwind, northwind_ib, "broken", faults={"nvidia_smi_garbage": ""})
    add_local_host(northwind, northwind_ib, "good")

    offers = services.offers(services.visible_hosts(alice))
    assert [(o["gpu_model"], o["free_gpus"], o["hosts"]) for o in offers] == [("H100", 8, 1)]


def test_retry_after_fix_makes_host_available(northwind, northwind_ib, add_local_host, root, committed):
    host = add_local_host(northwind, northwind_ib, "flaky", faults={"ecc_uncorrectable": "0"})
    assert host.state == HostState.FAILED
    (services.sandbox_path(host) / "faults" / "ecc_uncorrectable").unlink()

    with committed():
        services.act_on_host(host, "rediscover", root)  # local hosts: platform admins

    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE and host.error_code == "" and host.gpus.count() == 8


def test_onboarding_task_redelivered_after_completion_changes_nothing(
    northwind, northwind_ib, add_local_host
):
    host = add_local_host(northwind, northwind_ib, "once")
    events = host.events.count()

    again = services.onboard_host(host.pk)

    assert again.state == HostState.AVAILABLE and again.events.count() == events


def test_add_host_queues_onboarding_through_celery(northwind, northwind_ib, root, committed):
    block = northwind_ib.blocks.first()
    request = services.HostRequest(
        name="queued",
        block=block,
        driver="local",
        price_per_gpu_hour=2,
        local_spec=services.default_local_spec("A100", 4, northwind_ib.kind),
    )
    with committed():
        host = services.add_host(northwind, request, actor=root)

    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE and host.gpu_count == 4
    history = list(host.events.order_by("at", "id").values_list("to_state", flat=True))
    assert history[0] == HostState.ONBOARDING and history[-1] == HostState.AVAILABLE


def test_drain_cordon_uncordon_retire(northwind, northwind_ib, add_local_host, priya):
    host = add_local_host(northwind, northwind_ib, "life")
    for action, state in [
        ("drain", "draining"),
        ("cordon", "cordoned"),
        ("uncordon", "available"),
        ("retire", "retired"),
    ]:
        host = services.act_on_host(host, action, priya)
        assert Host.objects.get(pk=host.pk).state == state
    with pytest.raises(IllegalTransition):
        services.act_on_host(host, "uncordon", priya)
    assert host.events.filter(actor=priya, to_state="retired").exists()


def test_retired_hosts_free_their_address_for_a_new_host(northwind, northwind_ib, add_local_host, priya):
    old = add_local_host(northwind, northwind_ib, "old")
    services.act_on_host(old, "retire", priya)
    new = add_local_host(northwind, northwind_ib, "new")
    assert new.address == old.address


def test_health_sweep_cordons_host_whose_gpu_goes_bad_and_marks_unreachable_offline(
    northwind, northwind_ib, add_local_host
):
    sick = add_local_host(northwind, northwind_ib, "sick")
    gone = add_local_host(northwind, northwind_ib, "gone")
    fine = add_local_host(northwind, northwind_ib, "fine")
    set_fault(services.sandbox_path(sick), "ecc_uncorrectable", "4")
    set_fault(services.sandbox_path(gone), "unreachable")

    outcome = services.health_sweep()

    states = dict(Host.objects.values_list("name", "state"))
    assert states == {"sick": "cordoned", "gone": "offline", "fine": "available"}
    assert outcome == {"cordoned": 1, "offline": 1, "ok": 1}
    fine.refresh_from_db()
    assert fine.last_heartbeat_at is not None


def test_offline_host_comes_back_when_reachable(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "blip")
    set_fault(services.sandbox_path(host), "unreachable")
    services.health_sweep()
    (services.sandbox_path(host) / "faults" / "unreachable").unlink()
    services.health_sweep()
    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE


def test_reaper_fails_hosts_stuck_in_onboarding(northwind, northwind_ib, add_local_host):
    from django.utils import timezone

    host = add_local_host(northwind, northwind_ib, "stuck", onboard=False)
    Host.objects.filter(pk=host.pk).update(onboarding_started_at=timezone.now() - timezone.timedelta(hours=2))

    assert services.reap_stuck_onboarding() == 1
    host.refresh_from_db()
    assert host.state == HostState.FAILED and host.error_code == "timeout"
