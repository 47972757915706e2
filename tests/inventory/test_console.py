"""Console pages rendered for each persona (the browser tests drive the same pages in Chromium)."""

import pytest

from inventory.choices import HostState
from inventory.models import Host, Provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def hosts(northwind, northwind_ib, helios, helios_roce, add_local_host):
    return {
        "h100": add_local_host(northwind, northwind_ib, "iad1-h100-01"),
        "bad": add_local_host(northwind, northwind_ib, "iad1-bad", faults={"nvidia_smi_missing": ""}),
        "a100": add_local_host(helios, helios_roce, "ams1-a100-01", model="A100", price="1.29"),
    }


def test_anonymous_visitor_is_sent_to_login(client):
    response = client.get("/inventory/")
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_offers_page_lists_capacity_and_draws_a_chart(client, alice, hosts):
    client.force_login(alice)
    page = client.get("/inventory/").content.decode()
    assert "H100" in page and "A100" in page and "offers-chart" in page
    assert "/static/plotly/plotly.min.js" in page
    assert client.get("/static/plotly/plotly.min.js").status_code == 200


def test_offers_page_with_no_match_says_how_to_widen(client, alice, hosts):
    client.force_login(alice)
    page = client.get("/inventory/?model=H200").content.decode()
    assert "No offers match" in page and "Clear the filters" in page


def test_hosts_page_filters_sorts_and_shows_states(client, alice, hosts):
    client.force_login(alice)
    page = client.get("/inventory/hosts/?interconnect=roce&sort=-price").content.decode()
    assert "ams1-a100-01" in page and "iad1-h100-01" not in page
    assert "iad1-bad" not in client.get("/inventory/hosts/").content.decode()


def test_invalid_filter_shows_inline_error_not_500(client, alice, hosts):
    client.force_login(alice)
    response = client.get("/inventory/hosts/?max_price=cheap")
    assert response.status_code == 200 and "Enter a number" in response.content.decode()


def test_failed_host_page_shows_the_error_to_its_provider_only(client, priya, omar, hosts):
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{hosts['bad'].pk}/").content.decode()
    assert (
        "Onboarding failed" in page and "nvidia-smi is not installed" in page and "No GPUs recorded" in page
    )
    assert "Retry onboarding" in page
    client.force_login(omar)
    assert client.get(f"/inventory/hosts/{hosts['bad'].pk}/").status_code == 404


def test_provider_adds_local_host_through_the_form(
    client, priya, northwind, northwind_ib, committed, settings
):
    settings.VOLT_LOCAL_HOSTS_FOR_PROVIDERS = True  # as in the demo
    client.force_login(priya)
    form = {
        "name": "iad1-a100-09",
        "block": northwind_ib.blocks.first().pk,
        "driver": "local",
        "price_per_gpu_hour": "1.55",
        "gpu_model": "A100",
        "gpu_count": "8",
        "fault": "",
    }
    with committed():
        response = client.post(f"/inventory/providers/{northwind.slug}/hosts/new/", form)
    host = Host.objects.get(name="iad1-a100-09")
    assert response.status_code == 302 and response.url == f"/inventory/hosts/{host.pk}/"
    assert host.state == HostState.AVAILABLE and host.gpus.count() == 8


def test_host_form_shows_inline_errors_and_creates_nothing(client, priya, northwind, northwind_ib):
    client.force_login(priya)
    form = {"name": "", "block": northwind_ib.blocks.first().pk, "driver": "ssh", "price_per_gpu_hour": "-2"}
    response = client.post(f"/inventory/providers/{northwind.slug}/hosts/new/", form)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert {"name", "price_per_gpu_hour", "address", "ssh_private_key"} <= set(errors)
    assert not Host.objects.exists()


def test_host_form_without_fabric_sends_provider_to_add_one(client, priya, northwind):
    client.force_login(priya)
    response = client.get(f"/inventory/providers/{northwind.slug}/hosts/new/")
    assert response.status_code == 302 and response.url.endswith("/fabrics/new/")


def test_provider_registers_adds_fabric_and_platform_admin_approves(client, make_user, root):
    owner = make_user("nia")
    client.force_login(owner)
    response = client.post("/inventory/providers/new/", {"name": "Nebula Racks", "contact_email": ""})
    provider = Provider.objects.get(name="Nebula Racks")
    assert response.url == f"/inventory/providers/{provider.slug}/" and provider.status == "pending"
    fabric = {
        "site": "",
        "new_site_name": "fra2",
        "new_site_region": "eu-central",
        "name": "fra2-ib",
        "kind": "ib_hdr",
        "per_host_gbytes_per_s": "",
        "oversubscription": "1",
        "blocks": "r1, r2",
    }
    assert client.post(f"/inventory/providers/{provider.slug}/fabrics/new/", fabric).status_code == 302
    assert list(provider.fabrics.get().blocks.values_list("name", flat=True)) == ["r1", "r2"]

    assert (
        client.post(f"/inventory/providers/{provider.slug}/review/", {"decision": "approve"}).status_code
        == 404
    )
    client.force_login(root)
    client.post(f"/inventory/providers/{provider.slug}/review/", {"decision": "approve"})
    provider.refresh_from_db()
    assert provider.status == "approved"


def test_host_actions_from_the_console(client, priya, omar, hosts):
    client.force_login(omar)
    assert client.post(f"/inventory/hosts/{hosts['h100'].pk}/cordon/").status_code == 404
    client.force_login(priya)
    client.post(f"/inventory/hosts/{hosts['h100'].pk}/cordon/")
    assert Host.objects.get(pk=hosts["h100"].pk).state == HostState.CORDONED
    response = client.post(f"/inventory/hosts/{hosts['h100'].pk}/drain/", follow=True)
    assert "cannot go from cordoned to draining" in response.content.decode()


def test_teams_page_lists_only_my_teams(client, alice, bob):
    client.force_login(bob)
    page = client.get("/teams/").content.decode()
    assert "Lab B" in page and "Lab A" not in page


@pytest.mark.parametrize("typed", ["a100", "A10", " a 100 "])
def test_model_filter_matches_as_a_researcher_types(client, alice, hosts, typed):
    client.force_login(alice)
    page = client.get("/inventory/hosts/", {"model": typed}).content.decode()
    assert "ams1-a100-01" in page and "iad1-h100-01" not in page
    offers = client.get("/inventory/", {"model": typed}).content.decode()
    assert "eu-west" in offers and "us-east" not in offers


def test_api_model_filter_stays_exact(client, alice, hosts):
    client.force_login(alice)
    assert client.get("/api/v1/hosts/", {"model": "A10"}).json()["results"] == []
    assert [h["name"] for h in client.get("/api/v1/hosts/", {"model": "a100"}).json()["results"]] == [
        "ams1-a100-01"
    ]


def test_each_interconnect_is_offered_once_and_roce_still_filters(client, alice, hosts):
    """The label "RoCE" appeared twice in the interconnect filter: the family "roce" and the fabric kind
    "roce" (the same value, the same hosts). Every label is offered once, on the hosts page and the
    cluster form."""
    import re

    client.force_login(alice)
    for url, select in (("/inventory/hosts/", "id_interconnect"), ("/clusters/new/", "id_interconnect")):
        page = client.get(url).content.decode()
        options = re.search(rf'<select name="interconnect"[^>]*id="{select}"[^>]*>(.*?)</select>', page, re.S)
        labels = re.findall(r"<option[^>]*>(.*?)</option>", options.group(1))
        assert labels.count("RoCE") == 1 and len(labels) == len(set(labels)), (url, labels)
    page = client.get("/inventory/hosts/?interconnect=roce").content.decode()
    assert "ams1-a100-01" in page and "iad1-h100-01" not in page


def test_a_host_added_with_nvidia_smi_missing_lists_that_fault(client, priya, hosts, client_for):
    """A host added with `nvidia_smi_missing` said "None: a healthy host." under Faults: that fault leaves
    no file in the sandbox's faults/ (the sandbox has no nvidia-smi). It is listed now, with no Clear
    button (it cannot be taken back), and the API lists it; clearing it is refused."""
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{hosts['bad'].pk}/").content.decode()
    faults = page.split('id="host-faults"', 1)[1].split("</ul>", 1)[0]
    assert "nvidia_smi_missing" in faults and "a healthy host" not in faults
    assert 'name="clear"' not in faults and "set when the host was added" in faults
    healthy = client.get(f"/inventory/hosts/{hosts['h100'].pk}/").content.decode()
    assert "None: a healthy host." in healthy

    api = client_for(priya)
    listed = api.get(f"/api/v1/hosts/{hosts['bad'].pk}/faults/").json()["faults"]
    assert listed == {"nvidia_smi_missing": ""}
    refused = api.delete(f"/api/v1/hosts/{hosts['bad'].pk}/faults/?fault=nvidia_smi_missing")
    assert refused.status_code == 400
    client.post(f"/inventory/hosts/{hosts['bad'].pk}/faults/", {"clear": "nvidia_smi_missing"})
    assert "cannot be cleared" in client.get(f"/inventory/hosts/{hosts['bad'].pk}/").content.decode()


def test_the_flash_after_retry_onboarding_does_not_contradict_the_page(
    client, root, northwind, northwind_ib, add_local_host, committed
):
    """After *Retry onboarding* the flash said "state is now Onboarding" while the page, loaded once the
    worker had onboarded the host, showed Available. The flash now says onboarding started."""
    from inventory import services

    host = add_local_host(northwind, northwind_ib, "flaky", faults={"nvidia_smi_garbage": ""})
    assert host.state == HostState.FAILED
    (services.sandbox_path(host) / "faults" / "nvidia_smi_garbage").unlink()
    client.force_login(root)
    with committed():
        response = client.post(f"/inventory/hosts/{host.pk}/rediscover/")
    page = client.get(response["Location"]).content.decode()
    assert '<span class="state state-available" id="host-state">Available</span>' in page
    flash = page.split('<ul class="flash">', 1)[1].split("</ul>", 1)[0]
    assert "onboarding started" in flash and "Onboarding" not in flash and "state is now" not in flash


def test_an_onboarding_host_offers_no_uncordon_and_refuses_one(client, priya, hosts):
    """The walk saw an Uncordon button on a host being onboarded: clicking it made the host available
    without its discovery. Only discovery ends onboarding."""
    host = hosts["h100"]
    Host.objects.filter(pk=host.pk).update(state=HostState.ONBOARDING)
    client.force_login(priya)
    page = client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    assert f"/inventory/hosts/{host.pk}/uncordon/" not in page
    assert f"/inventory/hosts/{host.pk}/retire/" in page  # what may be done still is offered
    response = client.post(f"/inventory/hosts/{host.pk}/uncordon/", follow=True)
    assert "cannot go from onboarding to available" in response.content.decode()
    assert Host.objects.get(pk=host.pk).state == HostState.ONBOARDING


def test_the_host_form_takes_a_private_address_for_an_ssh_host(client, priya, northwind, northwind_ib):
    """Issue 25: where Volt's SSH reaches a host through a gateway, the provider gives the address its other
    hosts reach it at; a malformed one is an inline error and creates nothing."""
    from tests.inventory.test_onboarding_rules import ssh_key

    client.force_login(priya)
    form = {"name": "nw-07", "block": northwind_ib.blocks.first().pk, "driver": "ssh", "price_per_gpu_hour": "2",
            "address": "gw.northwind.example", "ssh_port": "2207", "ssh_user": "volt", "ssh_private_key": ssh_key()}  # fmt: skip
    url = f"/inventory/providers/{northwind.slug}/hosts/new/"
    page = client.get(url).content.decode()
    assert 'name="private_address"' in page and "Private address (SSH)" in page
    bad = client.post(url, form | {"private_address": "10.77.1"})
    assert bad.status_code == 200 and "private_address" in bad.context["form"].errors
    assert not Host.objects.exists()
    client.post(url, form | {"private_address": "10.77.1.17"})
    assert Host.objects.get().private_address == "10.77.1.17" and Host.objects.get().node_ip == "10.77.1.17"


def test_the_host_form_takes_a_forwarded_udp_port_and_the_host_page_shows_it(
    client, priya, northwind, northwind_ib
):
    """Issue 26: the UDP port a provider forwards to a host (its WireGuard overlay's) is on the form, a
    malformed one is an inline error that creates nothing, and the host's page shows the one it keeps."""
    from tests.inventory.test_onboarding_rules import ssh_key

    client.force_login(priya)
    form = {"name": "nw-08", "block": northwind_ib.blocks.first().pk, "driver": "ssh", "price_per_gpu_hour": "2",
            "address": "gw.northwind.example", "ssh_user": "volt", "ssh_private_key": ssh_key()}  # fmt: skip
    url = f"/inventory/providers/{northwind.slug}/hosts/new/"
    page = client.get(url).content.decode()
    assert 'name="overlay_endpoint"' in page and "Forwarded UDP port (SSH)" in page
    bad = client.post(url, form | {"overlay_endpoint": "203.0.113.7"})
    assert bad.status_code == 200 and "e.g. 203.0.113.7:51821" in bad.content.decode()
    assert not Host.objects.exists()
    client.post(url, form | {"overlay_endpoint": "203.0.113.7:51821"})
    host = Host.objects.get()
    assert host.overlay_endpoint == "203.0.113.7:51821"
    Host.objects.filter(pk=host.pk).update(
        system={"user": "volt", "privilege": "sudo", "addresses": ["10.0.0.5"]}
    )
    assert (
        'forwarded UDP port <span class="mono">203.0.113.7:51821</span>'
        in client.get(f"/inventory/hosts/{host.pk}/").content.decode()
    )
