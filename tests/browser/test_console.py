"""What researchers and provider admins see in the console, driven through Chromium against the real stack.

The demo inventory (seed_demo) is shared by every test: tests add hosts with names of their own and
never change the seeded ones, so they can run in any order.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

ONBOARDING_TIMEOUT_MS = 30_000
NORTHWIND = "Northwind GPU Cloud"


def offer_row(page: Page, model: str, region: str):
    return (
        page.locator("#offers-table tbody tr")
        .filter(has=page.locator("td:nth-child(1)", has_text=re.compile(rf"^{re.escape(model)}$")))
        .filter(has=page.locator("td:nth-child(3)", has_text=region))
    )


def host_names(page: Page) -> list[str]:
    return page.locator("#hosts-table tbody tr td:first-child").all_inner_texts()


def host_prices(page: Page) -> list[Decimal]:
    return [Decimal(t) for t in page.locator("#hosts-table tbody tr td:nth-child(7)").all_inner_texts()]


def nav(page: Page, name: str) -> None:
    """Click an entry of the top navigation bar."""
    page.locator(".mainnav").get_by_role("link", name=name, exact=True).click()


def open_add_host_form(page: Page, provider: str = NORTHWIND) -> None:
    """Providers → <provider> → Add host, as a provider admin would click through."""
    nav(page, "Providers")
    page.locator("#providers-table").get_by_role("link", name=provider).click()
    expect(page.locator("h1")).to_contain_text(provider)
    page.get_by_role("link", name="Add host", exact=True).click()
    expect(page.locator("h1")).to_have_text("Add a host")


def fill_local_host(
    page: Page, name: str, block: str, price: str, model: str = "A100", count: str = "8", fault: str = ""
) -> None:
    page.fill("#id_name", name)
    page.select_option("#id_block", label=block)
    page.fill("#id_price_per_gpu_hour", price)
    page.select_option("#id_driver", value="local")
    page.select_option("#id_gpu_model", value=model)
    page.fill("#id_gpu_count", count)
    if fault:
        page.select_option("#id_fault", label=fault)


def submit_host_form(page: Page) -> None:
    page.get_by_role("button", name="Add host and start onboarding").click()


def hosts_named(name: str) -> int:
    from inventory.models import Host

    return Host.objects.filter(name=name).count()


# --- 1. signing in and the offers page -----------------------------------------------------------------


def test_researcher_signs_in_and_sees_offers_with_chart(page, login, screenshot):
    login("alice")

    expect(page).to_have_url(re.compile(r"/inventory/$"))
    expect(page.locator("h1")).to_have_text("GPU offers")
    for model in ("H100-SXM", "A100-80GB", "RTX 4090", "L40S"):
        expect(
            page.locator("#offers-table tbody td:first-child", has_text=re.compile(rf"^{model}$")).first
        ).to_be_visible()
    # Free GPUs / total, per model and region (seeded: 4 x 8 H100 in iad1, 2 x 4 RTX 4090, 1 x 4 L40S).
    expect(offer_row(page, "H100-SXM", "us-east").locator("td:nth-child(5)")).to_have_text("32 / 32")
    expect(offer_row(page, "H100-SXM", "eu-west").locator("td:nth-child(5)")).to_have_text("8 / 8")
    expect(offer_row(page, "RTX 4090", "us-east").locator("td:nth-child(5)")).to_have_text("8 / 8")
    expect(offer_row(page, "L40S", "eu-west").locator("td:nth-child(5)")).to_have_text("4 / 4")
    expect(offer_row(page, "H100-SXM", "us-east").locator("td:nth-child(2)")).to_have_text("80 GiB")
    expect(offer_row(page, "H100-SXM", "us-east").locator("td:nth-child(4)")).to_have_text("InfiniBand NDR")
    expect(offer_row(page, "H100-SXM", "us-east").locator("td:nth-child(8)")).to_have_text("$2.39 – $2.59")
    expect(offer_row(page, "L40S", "eu-west").locator("td:nth-child(8)")).to_have_text("$0.89")
    # Plotly drew the chart (served from the app, no CDN).
    expect(page.locator("#offers-chart svg.main-svg").first).to_be_attached()
    expect(page.locator("#offers-chart .bars .point").first).to_be_attached()
    expect(page.locator("#offers-chart .ytitle")).to_have_text("free GPUs")
    screenshot(page, "offers")


def test_wrong_password_shows_error_and_stays_signed_out(page, login):
    login("alice", "not-the-password")

    expect(page.locator(".login-card .error")).to_have_text("Username and password did not match. Try again.")
    expect(page).to_have_url(re.compile(r"/login/$"))
    expect(page.locator("#id_username")).to_have_value("alice")
    expect(page.locator(".mainnav")).to_have_count(0)


# --- 2. browsing and filtering hosts -------------------------------------------------------------------


def test_researcher_filters_and_sorts_hosts(page, login, screenshot):
    login("alice")
    nav(page, "Hosts")
    expect(page.locator("h1")).to_have_text("Hosts")

    page.fill("#id_model", "H100")
    page.select_option("#id_interconnect", value="infiniband")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#hosts-table tbody tr")).to_have_count(4)
    assert sorted(host_names(page)) == ["iad1-h100-01", "iad1-h100-02", "iad1-h100-03", "iad1-h100-04"]
    assert set(page.locator("#hosts-table tbody td:nth-child(3)").all_inner_texts()) == {"us-east / iad1"}
    assert host_prices(page) == sorted(host_prices(page)), "cheapest first by default"

    page.locator("#hosts-table thead").get_by_role("link", name="$ / GPU-hour").click()
    expect(page).to_have_url(re.compile(r"sort=-price"))
    expect(page.locator("#hosts-table tbody tr").first.locator("td").first).to_have_text("iad1-h100-03")
    assert host_prices(page) == sorted(host_prices(page), reverse=True)
    expect(page.locator("#id_model")).to_have_value("H100")  # sorting keeps the filters

    page.fill("#id_max_price", "2.45")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#hosts-table tbody tr")).to_have_count(1)
    assert host_names(page) == ["iad1-h100-04"]
    assert host_prices(page) == [Decimal("2.39")]
    screenshot(page, "hosts-filtered")

    page.fill("#id_max_price", "1")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".empty h2")).to_have_text("No hosts match")
    expect(page.locator("#hosts-table")).to_have_count(0)
    page.get_by_role("link", name="Clear the filters").click()
    for name in ("iad1-h100-01", "iad1-4090-02", "ams1-a100-01", "ams1-l40s-01"):
        expect(page.locator("#hosts-table tbody tr", has_text=name)).to_have_count(1)
    expect(page.locator("#id_model")).to_have_value("")


# --- 3, 4. onboarding through the console -----------------------------------------------------------


def test_provider_admin_onboards_local_host_and_watches_it_become_available(
    page, login, live_stack, screenshot
):
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))
    login("priya")
    open_add_host_form(page)
    fill_local_host(page, "iad1-a100-07", "iad1 / iad1-ib / r02", "1.55", model="A100", count="8")

    # Hold onboarding in the queue until the page is up, so the user sees it change live.
    live_stack.pause_queue("provisioning")
    try:
        submit_host_form(page)
        expect(page).to_have_url(re.compile(r"/inventory/hosts/\d+/$"))
        expect(page.locator("h1")).to_have_text("iad1-a100-07")
        expect(page.locator(".flash")).to_contain_text("iad1-a100-07 added and onboarding started")
        expect(page.locator("#host-state")).to_have_text("Onboarding")
        expect(page.locator("#host-status")).to_contain_text("Discovering GPUs")
        page.evaluate("window.__notReloaded = true")
    finally:
        live_stack.resume_queue("provisioning")

    expect(page.locator("#host-state")).to_have_text("Available", timeout=ONBOARDING_TIMEOUT_MS)
    expect(page.locator("#gpu-table tbody tr")).to_have_count(8)
    expect(page.locator("#gpu-table tbody tr").first.locator("td:nth-child(2)")).to_contain_text("A100")
    expect(page.locator("#host-status")).to_contain_text("8 × A100")
    expect(page.locator("h2:has-text('Interconnect') + table tbody tr")).to_have_count(8)  # 8 NDR ports
    history = page.locator("#host-history")
    expect(history).to_contain_text("new → onboarding")
    expect(history).to_contain_text("onboarding → available")
    expect(history).to_contain_text("found 8 x A100")
    expect(history).to_contain_text("by priya")
    assert page.evaluate("window.__notReloaded === true"), "all of this arrived without a reload"
    assert any('"state": "available"' in f for f in frames), (
        f"no live state event over the websocket: {frames}"
    )
    screenshot(page, "host-available")


@pytest.mark.parametrize(
    ("name", "fault", "code", "detail"),
    [
        ("iad1-nosmi-01", "nvidia_smi_missing", "nvidia-smi missing", "nvidia-smi is not installed"),
        ("iad1-garbage-01", "nvidia_smi_garbage", "Unreadable hardware report", "output Volt cannot read"),
    ],
    ids=["nvidia-smi-missing", "nvidia-smi-garbage"],
)
def test_onboarding_a_broken_host_shows_why_it_failed(page, login, screenshot, name, fault, code, detail):
    login("priya")
    open_add_host_form(page)
    fill_local_host(page, name, "iad1 / iad1-eth / e01", "0.50", model="RTX 4090", count="4", fault=fault)
    submit_host_form(page)

    expect(page).to_have_url(re.compile(r"/inventory/hosts/\d+/$"))
    expect(page.locator("#host-state")).to_have_text("Onboarding failed", timeout=ONBOARDING_TIMEOUT_MS)
    error = page.locator("#host-error")
    expect(error).to_contain_text(code)
    expect(error).to_contain_text(detail)
    expect(page.locator("#no-gpus")).to_contain_text("No GPUs recorded")
    expect(page.locator("#gpu-table")).to_have_count(0)
    expect(page.get_by_role("button", name="Retry onboarding")).to_be_visible()
    if fault == "nvidia_smi_missing":
        screenshot(page, "host-failed")

    page.get_by_role("link", name=NORTHWIND).click()
    row = page.locator("#provider-hosts tbody tr", has=page.get_by_role("link", name=name))
    expect(row).to_contain_text("Onboarding failed")
    expect(row).to_contain_text(code)


# --- 5. provider isolation -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def northwind_failed_host(orm) -> int:
    """A Northwind host that failed onboarding (nvidia-smi missing), made through the services."""

    def make() -> int:
        from inventory import services
        from inventory.models import Block

        block = Block.objects.get(fabric__name="iad1-eth", name="e01")
        request = services.HostRequest(
            name="iad1-private-01",
            block=block,
            driver="local",
            price_per_gpu_hour=Decimal("0.40"),
            local_spec=services.default_local_spec("RTX 4090", 4, block.fabric.kind),
            local_faults={"nvidia_smi_missing": ""},
        )
        host = services.add_host(block.fabric.provider, request, queue=False)
        return services.onboard_host(host.pk).pk

    return orm(make)


def test_other_provider_admin_cannot_open_a_hosts_page(page, login, northwind_failed_host):
    login("omar")
    response = page.goto(f"/inventory/hosts/{northwind_failed_host}/")
    assert response.status == 404
    expect(page.locator("body")).not_to_contain_text("iad1-private-01")

    page.goto("/inventory/hosts/")
    providers = set(page.locator("#hosts-table tbody td:nth-child(2)").all_inner_texts())
    assert providers == {"Helios Compute"}, "a provider admin sees only their own hosts"


def test_researcher_of_another_team_sees_only_available_hosts(page, login, northwind_failed_host):
    login("bob")
    nav(page, "Hosts")
    rows = page.locator("#hosts-table tbody tr")
    expect(rows.first).to_be_visible()
    assert set(page.locator("#hosts-table tbody td:nth-child(9)").all_inner_texts()) == {"Available"}
    assert "iad1-private-01" not in host_names(page)
    assert set(page.locator("#hosts-table tbody td:nth-child(2)").all_inner_texts()) == {
        NORTHWIND,
        "Helios Compute",
    }

    response = page.goto(f"/inventory/hosts/{northwind_failed_host}/")
    assert response.status == 404
    # A researcher reading a provider's page sees its available hosts, but no way to change them.
    page.goto("/inventory/providers/")
    page.locator("#providers-table").get_by_role("link", name=NORTHWIND).click()
    expect(page.locator("#provider-hosts")).not_to_contain_text("iad1-private-01")
    expect(page.get_by_role("link", name="Add host")).to_have_count(0)


# --- 6. form errors ----------------------------------------------------------------------------------


def test_add_host_form_shows_errors_inline_and_creates_nothing(page, login, orm, screenshot):
    login("priya")
    open_add_host_form(page)
    form_url = page.url

    # The browser itself refuses an empty name and a negative price (HTML validation)...
    fill_local_host(page, "", "iad1 / iad1-ib / r01", "-1")
    submit_host_form(page)
    assert page.locator("#id_name").evaluate("e => e.validity.valueMissing")
    assert page.locator("#id_price_per_gpu_hour").evaluate("e => e.validity.rangeUnderflow")
    assert page.url == form_url

    # ...and so does the server when the browser does not check (old browser, scripted client).
    page.locator("#host-form").evaluate("f => f.noValidate = true")
    submit_host_form(page)
    expect(page.locator("#field-name .error")).to_have_text("This field is required.")
    expect(page.locator("#field-price_per_gpu_hour .error")).to_have_text(
        "Ensure this value is greater than or equal to 0."
    )
    expect(page.locator("#field-name")).to_have_class(re.compile(r"\bhas-error\b"))
    expect(page.locator("#id_price_per_gpu_hour")).to_have_value("-1")  # input kept for fixing
    screenshot(page, "host-form-errors")

    # A name the provider already uses passes the browser but not the server.
    page.fill("#id_name", "iad1-h100-01")
    page.fill("#id_price_per_gpu_hour", "2.00")
    submit_host_form(page)
    expect(page.locator("#field-name .error")).to_have_text("You already have a host named 'iad1-h100-01'.")
    expect(page.locator("#field-price_per_gpu_hour .error")).to_have_count(0)

    assert orm(hosts_named, "") == 0
    assert orm(hosts_named, "iad1-h100-01") == 1
    page.get_by_role("link", name=NORTHWIND).click()
    expect(page.locator("#provider-hosts tbody tr", has_text="iad1-h100-01")).to_have_count(1)
