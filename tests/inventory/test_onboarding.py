"""Onboarding through the local driver: the real simulator, parsers and state machine run."""

import pytest

from inventory import health, services
from inventory.choices import HostEventKind, HostState
from inventory.drivers.local import create_sandbox, set_fault
from inventory.models import GPU, Host
from voltweb.statemachine import IllegalTransition

pytestmark = pytest.mark.django_db


def test_healthy_h100_host_becomes_available_with_its_gpus(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "iad1-h100-01")

    assert host.state == HostState.AVAILABLE
    assert (host.gpu_model, host.gpu_count, host.free_gpus, host.nvlink_domain_size) == ("H100-SXM", 8, 8, 8)
    gpus = list(host.gpus.all())
    assert [g.index for g in gpus] == list(range(8))
    assert {g.model for g in gpus} == {"H100-SXM"} and {g.nvlink_domain for g in gpus} == {0}
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
        ({"driver_not_loaded": ""}, "driver_not_loaded", "sudo modprobe nvidia"),
        ({"unreachable": ""}, "unreachable", "not answering"),
        ({"gpu_lost": ""}, "gpu_unhealthy", "Unable to determine the device handle"),
        ({"ecc_uncorrectable": ""}, "gpu_unhealthy", "uncorrectable ECC"),
        ({"hot": ""}, "gpu_unhealthy", "96 C"),
        (
            {"ecc_uncorrectable": "0,1,2,3", "hot": "4,5,6", "gpu_lost": "7"},
            "gpu_unhealthy",
            "No healthy GPU",
        ),
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


@pytest.mark.parametrize(
    ("faults", "index", "health", "words"),
    [
        ({"ecc_uncorrectable": "5"}, 5, "unhealthy", "2 uncorrectable ECC errors"),
        ({"hot": "2"}, 2, "unhealthy", "runs at 96 C"),
    ],
)
def test_one_bad_gpu_is_set_aside_and_the_host_is_onboarded(
    alice, northwind, northwind_ib, add_local_host, faults, index, health, words
):
    host = add_local_host(northwind, northwind_ib, "one-bad", faults=faults)

    assert host.state == HostState.AVAILABLE, host.error_message
    bad = host.gpus.get(index=index)
    assert bad.health == health and words in bad.health_reason and f"GPU {index}" in bad.health_reason
    assert host.gpu_count == 8 and host.free_gpus == 7 and host.nvlink_domain_size == 7
    assert index not in [i for domain in host.free_gpu_map for i in domain]
    assert host.discovery["gpu_problems"] == {str(index): bad.health_reason.split(" ", 2)[2]}
    assert host.events.filter(kind=HostEventKind.HEALTH, message__contains=words).exists()
    offer = services.offers(services.visible_hosts(alice))[0]
    assert (offer["free_gpus"], offer["total_gpus"], offer["max_free_gpus_per_host"]) == (7, 8, 7)


def test_lost_gpu_is_named_and_the_others_onboarded(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "lost-one", faults={"gpu_lost": "3"})

    assert host.state == HostState.AVAILABLE
    assert sorted(host.gpus.values_list("index", flat=True)) == [0, 1, 2, 4, 5, 6, 7]
    assert host.free_gpus == 7
    [lost] = host.discovery["lost_gpus"]
    assert lost["pci_bus_id"] == "5d:00.0" and "Unable to determine the device handle" in lost["message"]


def test_failed_host_is_never_offered(alice, northwind, northwind_ib, add_local_host):
    add_local_host(northwind, northwind_ib, "broken", faults={"nvidia_smi_garbage": ""})
    add_local_host(northwind, northwind_ib, "good")

    offers = services.offers(services.visible_hosts(alice))
    assert [(o["gpu_model"], o["free_gpus"], o["hosts"]) for o in offers] == [("H100-SXM", 8, 1)]


def test_retry_after_fix_makes_host_available(northwind, northwind_ib, add_local_host, root, committed):
    host = add_local_host(northwind, northwind_ib, "flaky", faults={"ecc_uncorrectable": ""})
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


def _released_allocation(team, host, gpu):
    from clusters.models import Allocation, Cluster, ClusterNode

    cluster = Cluster.objects.create(team=team, name="past-run", spec={}, status="terminated")
    node = ClusterNode.objects.create(cluster=cluster, host=host, rank=0, gpu_indices=[gpu.index])
    return Allocation.objects.create(cluster=cluster, node=node, gpu=gpu, active=False)


def test_retired_machine_added_again_comes_back_with_its_gpus_and_history(
    northwind, northwind_ib, add_local_host, priya, team_a
):
    old = add_local_host(northwind, northwind_ib, "rack-a-07")
    uuids = sorted(old.gpus.values_list("uuid", flat=True))
    past = _released_allocation(team_a, old, old.gpus.get(index=2))
    services.act_on_host(old, "retire", priya)
    new = add_local_host(northwind, northwind_ib, "rack-b-07", onboard=False)
    # The same machine, moved to another rack: same sandbox spec (so the same GPU UUIDs).
    Host.objects.filter(pk=new.pk).update(local_spec=old.local_spec)
    create_sandbox(services.sandbox_path(new), old.local_spec)

    new = services.onboard_host(new.pk)

    assert new.state == HostState.AVAILABLE, new.error_message
    assert sorted(new.gpus.values_list("uuid", flat=True)) == uuids
    assert (new.gpu_count, new.free_gpus) == (8, 8)
    past.refresh_from_db()
    assert past.gpu.host_id == new.pk and past.node.host_id == old.pk  # history: which host ran it then
    assert Host.objects.get(pk=old.pk).free_gpus == 0


def test_machine_still_owned_by_a_live_host_fails_clearly_and_a_retry_after_retiring_succeeds(
    northwind, northwind_ib, add_local_host, root, committed
):
    first = add_local_host(northwind, northwind_ib, "first")
    twin = add_local_host(northwind, northwind_ib, "twin", onboard=False)
    Host.objects.filter(pk=twin.pk).update(local_spec=first.local_spec)
    create_sandbox(services.sandbox_path(twin), first.local_spec)

    twin = services.onboard_host(twin.pk)

    assert twin.state == HostState.FAILED and twin.error_code == "gpu_owned_elsewhere"
    assert "first" in twin.error_message and "retire the other host" in twin.error_message
    services.act_on_host(first, "retire", root)
    with committed():
        services.act_on_host(twin, "rediscover", root)
    twin.refresh_from_db()
    assert twin.state == HostState.AVAILABLE and twin.gpus.count() == 8


def test_an_error_while_recording_discovery_fails_the_host_with_a_message(
    northwind, northwind_ib, add_local_host, monkeypatch
):
    from inventory import onboarding

    host = add_local_host(northwind, northwind_ib, "oops", onboard=False)

    def broken(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(onboarding, "store_ports", broken)
    host = services.onboard_host(host.pk)

    assert host.state == HostState.FAILED and host.error_code == "internal_error"
    assert "disk full" in host.error_message and not host.gpus.exists()


def test_health_sweep_sets_a_bad_gpu_aside_cordons_a_host_with_none_left_and_marks_unreachable_offline(
    northwind, northwind_ib, add_local_host
):
    sick = add_local_host(northwind, northwind_ib, "sick")
    dead = add_local_host(northwind, northwind_ib, "dead")
    gone = add_local_host(northwind, northwind_ib, "gone")
    fine = add_local_host(northwind, northwind_ib, "fine")
    set_fault(services.sandbox_path(sick), "ecc_uncorrectable", "4")
    set_fault(services.sandbox_path(dead), "ecc_uncorrectable", "")
    set_fault(services.sandbox_path(gone), "unreachable")

    outcome = health.health_sweep()

    states = dict(Host.objects.values_list("name", "state"))
    assert states == {"sick": "available", "dead": "cordoned", "gone": "offline", "fine": "available"}
    assert outcome == {"cordoned": 1, "offline": 1, "ok": 2}
    sick.refresh_from_db()
    assert sick.free_gpus == 7 and [4] not in sick.free_gpu_map and 4 not in sum(sick.free_gpu_map, [])
    assert "uncorrectable ECC" in sick.gpus.get(index=4).health_reason
    assert sick.events.filter(kind=HostEventKind.HEALTH, message__contains="GPU 4").exists()
    fine.refresh_from_db()
    assert fine.last_heartbeat_at is not None

    services.sandbox_path(sick).joinpath("faults", "ecc_uncorrectable").unlink()
    health.health_sweep()
    sick.refresh_from_db()
    assert sick.free_gpus == 8 and sick.gpus.get(index=4).health == "healthy"


def test_health_sweep_marks_a_gpu_that_falls_off_the_bus_lost(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "falls")
    set_fault(services.sandbox_path(host), "gpu_lost", "6")

    assert health.health_sweep() == {"ok": 1}

    host.refresh_from_db()
    gpu = host.gpus.get(index=6)
    assert gpu.health == "lost" and "device handle" in gpu.health_reason and host.free_gpus == 7


def test_offline_host_comes_back_when_reachable(northwind, northwind_ib, add_local_host):
    host = add_local_host(northwind, northwind_ib, "blip")
    set_fault(services.sandbox_path(host), "unreachable")
    health.health_sweep()
    (services.sandbox_path(host) / "faults" / "unreachable").unlink()
    health.health_sweep()
    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE


def test_reaper_fails_hosts_stuck_in_onboarding(northwind, northwind_ib, add_local_host):
    from django.utils import timezone

    host = add_local_host(northwind, northwind_ib, "stuck", onboard=False)
    Host.objects.filter(pk=host.pk).update(onboarding_started_at=timezone.now() - timezone.timedelta(hours=2))

    assert services.reap_stuck_onboarding() == 1
    host.refresh_from_db()
    assert host.state == HostState.FAILED and host.error_code == "timeout"


def test_a_database_locked_while_recording_the_discovery_is_tried_again_not_a_failed_host(
    northwind, northwind_ib, add_local_host, monkeypatch
):
    """Issue 24.1: a healthy host failed onboarding with "database is locked" while a job ran (SQLite)."""
    from django.db import OperationalError

    host = add_local_host(northwind, northwind_ib, "busy-db", onboard=False)
    complete, calls = services._complete_onboarding, []

    def locked_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return complete(*args)

    monkeypatch.setattr(services, "_complete_onboarding", locked_once)
    monkeypatch.setattr(services.time, "sleep", lambda s: None)
    host = services.onboard_host(host.pk)

    assert len(calls) == 2
    assert host.state == HostState.AVAILABLE and host.error_code == "" and host.gpus.count() == 8
