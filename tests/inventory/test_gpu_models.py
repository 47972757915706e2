"""GPU variants through onboarding, offers and placement: A100 40GB vs 80GB, a family request, mixed hosts."""

import pytest

from clusters import planning
from clusters.placement import Refusal
from inventory import services
from inventory.models import GPU, Host

pytestmark = pytest.mark.django_db


def spec(*models, gpus=8):
    return {"name": "job", "nodes": 1, "gpus_per_node": gpus, "gpu_models": list(models)}


@pytest.fixture
def two_a100s(northwind, northwind_ib, add_local_host):
    small = add_local_host(northwind, northwind_ib, "a100-40", model="A100-40GB", price="1.10")
    large = add_local_host(northwind, northwind_ib, "a100-80", model="A100-80GB", price="1.60")
    return small, large


def test_onboarding_tells_a100_memory_sizes_apart(two_a100s):
    small, large = two_a100s

    assert (small.gpu_model, small.gpu_memory_mib) == ("A100-40GB", 40960)
    assert (large.gpu_model, large.gpu_memory_mib) == ("A100-80GB", 81920)
    assert set(small.gpus.values_list("model", flat=True)) == {"A100-40GB"}


def test_offers_group_by_precise_model_and_show_memory(alice, two_a100s, client):
    rows = services.offers(services.visible_hosts(alice))

    assert [(r["gpu_model"], r["memory_gib"], r["free_gpus"]) for r in rows] == [
        ("A100-40GB", 40, 8),
        ("A100-80GB", 80, 8),
    ]
    client.force_login(alice)
    assert {r["gpu_model"] for r in client.get("/api/v1/offers/?model=A100").json()["results"]} == {
        "A100-40GB",
        "A100-80GB",
    }
    assert [r["gpu_model"] for r in client.get("/api/v1/offers/?model=a100-80gb").json()["results"]] == [
        "A100-80GB"
    ]
    assert "80 GiB" in client.get("/inventory/").content.decode()


def test_a_family_request_matches_both_sizes_and_a_variant_only_itself(alice, two_a100s):
    small, large = two_a100s

    family = planning.preview(spec("A100"), alice)
    precise = planning.preview(spec("A100-80GB"), alice)

    assert family.model == "A100-40GB" and family.nodes[0].host_id == str(small.pk)  # the cheaper fits
    assert precise.model == "A100-80GB" and precise.nodes[0].host_id == str(large.pk)
    Host.objects.filter(pk=large.pk).update(state="cordoned")
    services.bump_capacity_version()
    assert isinstance(planning.preview(spec("A100-80GB"), alice), Refusal)  # the 40GB host never serves it
    assert planning.preview(spec("A100"), alice).model == "A100-40GB"
    with pytest.raises(planning.InvalidSpec, match="unknown GPU model 'B200'"):
        planning.preview(spec("B200"), alice)


def test_a_host_with_two_models_offers_each_apart(alice, northwind_ib, make_host):
    host = make_host(northwind_ib.blocks.first(), model="A100-80GB", gpus=4)
    GPU.objects.bulk_create(
        GPU(host=host, index=4 + i, uuid=f"GPU-mixed-{i}", model="L40S", name="NVIDIA L40S", memory_mib=46068)
        for i in range(4)
    )
    GPU.objects.filter(host=host, model="A100-80GB").update(memory_mib=81920)
    Host.objects.filter(pk=host.pk).update(gpu_model="A100-80GB + L40S", gpu_count=8)
    services.refresh_free_capacity([host.pk])

    rows = services.offers(services.visible_hosts(alice))

    assert [(r["gpu_model"], r["memory_gib"], r["free_gpus"], r["total_gpus"], r["hosts"]) for r in rows] == [
        ("A100-80GB", 80, 4, 4, 1),
        ("L40S", 45, 4, 4, 1),
    ]
