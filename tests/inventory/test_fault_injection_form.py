"""The add-host form's fault injection: every fault offered works on the host kind it is offered for.

Faults come from one table (inventory/drivers/faults.py); the form offers a fault only for GPU models it
means something on, gives a value field to a fault that takes one, and refuses the rest inline.
"""

import pytest

from inventory.choices import GpuHealth, HostState
from inventory.drivers import faults as fault_table
from inventory.forms import HostForm
from inventory.gpu_catalog import BY_MODEL
from inventory.models import Host

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _provider_admins_add_local_hosts(settings):
    """The demo's rule: provider admins may add simulated local hosts (elsewhere platform admins only)."""
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True


def shows_the_fault(host: Host, fault: str) -> bool:
    """What the provider sees of the fault after onboarding: a failed host, a GPU set aside with its
    reason (one bad GPU no longer fails a host), or — without ibstat — ports read from sysfs instead."""
    if fault == "ibstat_missing":
        return host.state == HostState.AVAILABLE and host.ports.filter(source="sysfs").exists()
    lost = (host.discovery or {}).get("lost_gpus")  # a GPU off the bus has no row, only its bus id
    return (
        host.state != HostState.AVAILABLE
        or host.gpus.exclude(health=GpuHealth.HEALTHY).exists()
        or bool(lost)
    )


# Faults whose effect onboarding's discovery and health check see (the others act later: `partitioned`
# when a Ray worker joins, `throttled` when the cluster probe measures the host).
SEEN_AT_ONBOARDING = [f.name for f in fault_table.CATALOG if f.name not in ("partitioned", "throttled")]


def add_host(client, provider, fabric, name, model, fault="", value=""):
    form = {"name": name, "block": fabric.blocks.first().pk, "driver": "local", "price_per_gpu_hour": "1.00",
            "gpu_model": model, "gpu_count": "4", "fault": fault, "fault_value": value}  # fmt: skip
    return client.post(f"/inventory/providers/{provider.slug}/hosts/new/", form)


def offered(provider, model: str) -> list[str]:
    """The faults the form's page lets a provider pick for `model` (what its script shows)."""
    html = HostForm(provider=provider)["fault"].as_widget()
    return [
        f.name for f in fault_table.CATALOG
        if f'value="{f.name}"' in html and model in html.split(f'value="{f.name}"')[1].split(">")[0]
    ]  # fmt: skip


@pytest.mark.parametrize("model", list(BY_MODEL))
@pytest.mark.parametrize("fault", SEEN_AT_ONBOARDING)
def test_every_offered_fault_makes_onboarding_fail_or_flag_the_host(
    client, priya, northwind, northwind_ib, committed, model, fault
):
    client.force_login(priya)
    if fault not in offered(northwind, model):
        response = add_host(client, northwind, northwind_ib, "h-x", model, fault)
        assert response.status_code == 200 and "fault" in response.context["form"].errors
        assert not Host.objects.exists()
        return
    with committed():
        add_host(client, northwind, northwind_ib, "h-x", model, fault)
    host = Host.objects.get(name="h-x")
    assert shows_the_fault(host, fault), f"{fault} on {model} came up healthy"


def test_ecc_fault_is_not_offered_for_gpus_without_ecc(client, priya, northwind, northwind_ib):
    assert "ecc_uncorrectable" not in offered(northwind, "RTX 4090")
    assert "ecc_uncorrectable" in offered(northwind, "H100")
    client.force_login(priya)
    response = add_host(client, northwind, northwind_ib, "iad1-4090-x", "RTX 4090", "ecc_uncorrectable")
    assert "RTX 4090 GPUs have no ECC memory" in response.content.decode()
    assert not Host.objects.exists()


def test_throttled_takes_a_cpu_share_and_the_host_onboards_with_it(
    client, priya, northwind, northwind_ib, committed
):
    client.force_login(priya)
    page = client.get(f"/inventory/providers/{northwind.slug}/hosts/new/").content.decode()
    assert 'id="id_fault_value"' in page and 'data-value-label="CPU share (% of one core)"' in page
    with committed():
        response = add_host(client, northwind, northwind_ib, "iad1-slow", "A100", "throttled", "30")
    host = Host.objects.get(name="iad1-slow")
    assert response.status_code == 302 and host.state == HostState.AVAILABLE, host.error_message
    from inventory.services import sandbox_path

    assert (sandbox_path(host) / "faults" / "throttled").read_text() == "30"


@pytest.mark.parametrize(
    "value, message", [("", "needs a value"), ("0", "between 1 and 100"), ("101", "between 1 and 100")]
)
def test_throttled_without_a_valid_share_is_refused_inline(
    client, priya, northwind, northwind_ib, value, message
):
    client.force_login(priya)
    response = add_host(client, northwind, northwind_ib, "iad1-slow", "A100", "throttled", value)
    assert response.status_code == 200 and message in " ".join(response.context["form"].errors["fault_value"])
    assert not Host.objects.exists()


def test_a_fault_table_entry_declares_value_range_and_host_kinds():
    throttled = fault_table.BY_NAME["throttled"]
    assert throttled.value and (throttled.value.minimum, throttled.value.maximum) == (1, 100)
    assert throttled.content(45) == "45" and fault_table.BY_NAME["gpu_lost"].content() == "0"
    ecc = fault_table.BY_NAME["ecc_uncorrectable"]
    assert ecc.problem(fault_table.HostKind("RTX 4090")) and ecc.problem(fault_table.HostKind("L40S")) is None


def test_every_fault_is_named_one_way_in_the_forms_and_the_messages(client, priya, northwind, northwind_ib):
    """The add-host form offered "nvidia smi garbage" while the host page, drills and API said
    "nvidia_smi_garbage": the name a person reads is the one they type."""
    client.force_login(priya)
    page = client.get(f"/inventory/providers/{northwind.slug}/hosts/new/").content.decode()
    assert ">nvidia_smi_garbage<" in page and "nvidia smi garbage" not in page
    assert all(f.label == f.name for f in fault_table.CATALOG)
