"""What a new user met in the console (issue 8), checked in Chromium against the real stack.

No page asks anything of another server; every page is usable 375 px wide; the console's own error
pages; the cluster list's shape; the GPU model filter as a researcher types; fault injection offered
only where it works. Clusters made here are rows in the TERMINATED state: nothing is provisioned.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

NARROW = {"width": 375, "height": 740}
# Pages that a script draws after loading, and what shows once it has (the Redoc sidebar footer).
RENDERED_BY_SCRIPT = {"/api/docs/": ".swagger-ui .info", "/api/redoc/": "text=API docs by Redocly"}


@pytest.fixture(scope="module")
def ended_cluster(orm):
    """A terminated 2 x 8 H100 cluster of Demo Lab (alice's team), for the list and detail pages."""

    def make():
        from clusters.models import Cluster
        from voltweb.models import Team

        spec = {"nodes": 2, "gpus_per_node": 8, "gpu_models": ["H100"], "parallelism": "data_parallel"}
        cluster, _ = Cluster.objects.get_or_create(
            name="shape-check",
            defaults={"team": Team.objects.get(slug="demo-lab"), "status": "terminated", "spec": spec,
                      "gpu_model": "H100"},
        )  # fmt: skip
        return cluster.pk

    return orm(make)


@pytest.fixture(scope="module")
def ids(orm):
    def find():
        from inventory.models import Host, Provider

        host = Host.objects.get(name="iad1-h100-01")
        return {"host": host.pk, "provider": Provider.objects.get(name="Northwind GPU Cloud").slug}

    return orm(find)


def console_pages(ids, cluster_pk) -> dict[str, list[str]]:
    """Every page a persona reaches from the navigation, by persona."""
    return {
        "alice": [
            "/inventory/", "/inventory/hosts/", f"/inventory/hosts/{ids['host']}/", "/clusters/",
            "/clusters/new/", f"/clusters/{cluster_pk}/", "/inventory/providers/", "/teams/",
            "/account/tokens/", "/api/docs/", "/api/redoc/", "/no/such/page/",
        ],
        "priya": [f"/inventory/providers/{ids['provider']}/", f"/inventory/providers/{ids['provider']}/hosts/new/"],
    }  # fmt: skip


def test_no_page_makes_a_request_that_leaves_the_server(browser, live_stack, ids, ended_cluster):
    own = urlparse(live_stack.url).netloc
    leaving: list[str] = []
    for username, paths in console_pages(ids, ended_cluster).items():
        context = browser.new_context(base_url=live_stack.url)
        context.set_default_timeout(20_000)

        def guard(route, request):
            if request.url.startswith(("http://", "https://")) and urlparse(request.url).netloc != own:
                leaving.append(f"{request.url} (from {route.request.frame.url})")
                return route.abort()
            return route.continue_()

        context.route("**/*", guard)
        page = sign_in(context.new_page(), username)
        for path in ["/login/", *paths]:
            page.goto(path, wait_until="networkidle")
            if (
                path in RENDERED_BY_SCRIPT
            ):  # wait until the script has drawn the page (and fetched its images)
                page.locator(RENDERED_BY_SCRIPT[path]).first.wait_for()
                page.wait_for_load_state("networkidle")
        context.close()
    assert not leaving, "\n".join(leaving)


def sign_in(page: Page, username: str) -> Page:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "volt-demo")
    page.click("button[type=submit]")
    expect(page.locator(".topbar .who")).to_contain_text(username)
    return page


def test_every_page_is_usable_375_px_wide(browser, live_stack, ids, ended_cluster, screenshot):
    problems = []
    for username, paths in console_pages(ids, ended_cluster).items():
        context = browser.new_context(base_url=live_stack.url, viewport=NARROW)
        context.set_default_timeout(20_000)
        page = sign_in(context.new_page(), username)
        for path in paths:
            if path.startswith("/api/"):
                continue  # Swagger UI and Redoc lay themselves out
            page.goto(path, wait_until="networkidle")
            layout = page.evaluate(
                """() => {
                  const doc = document.documentElement, bar = document.querySelector('header.topbar');
                  const main = document.querySelector('main');
                  return {overflow: doc.scrollWidth - window.innerWidth,
                          barBottom: bar.getBoundingClientRect().bottom, mainTop: main.getBoundingClientRect().top,
                          barSpill: bar.scrollHeight - bar.clientHeight};
                }"""
            )
            if layout["overflow"] > 0:
                problems.append(f"{path}: the page scrolls sideways by {layout['overflow']} px")
            if layout["barBottom"] > layout["mainTop"] + 0.5 or layout["barSpill"] > 1:
                problems.append(f"{path}: the navigation covers the content ({layout})")
            screenshot(page, "narrow-" + (path.strip("/").replace("/", "-") or "home"))
        context.close()
    assert not problems, "\n".join(problems)


def test_cluster_list_shows_the_shape_as_nodes_gpus_and_model(login, ended_cluster):
    page = login("alice")
    page.goto("/clusters/")
    row = page.locator("#clusters-table tbody tr", has_text="shape-check")
    expect(row.locator("td.shape")).to_have_text("2 × 8 H100")


def test_typing_part_of_a_model_finds_its_hosts(login, screenshot):
    page = login("alice")
    page.goto("/inventory/hosts/")
    page.fill("#id_model", "4090")
    page.get_by_role("button", name="Apply").click()
    # all_inner_texts() does not wait: read the cells only once the filtered page has loaded.
    page.wait_for_url("**/inventory/hosts/?*model=4090*")
    cells = page.locator("#hosts-table tbody tr td:nth-child(5)")
    expect(cells.first).to_contain_text("RTX 4090")
    models = cells.all_inner_texts()
    assert models and all("RTX 4090" in text for text in models), models
    screenshot(page, "hosts-filter-4090")


def test_a_missing_page_is_the_consoles_own_404_with_a_way_back(login, screenshot):
    page = login("alice")
    response = page.goto("/clusters/987654/")
    assert response.status == 404
    expect(page.locator("h1")).to_have_text("Page not found")
    screenshot(page, "error-404")
    page.get_by_role("link", name="Back to the console").click()
    expect(page.locator(".mainnav")).to_be_visible()


def test_add_host_form_offers_faults_only_where_they_work(login, ids, screenshot):
    page = login("priya")
    page.goto(f"/inventory/providers/{ids['provider']}/hosts/new/")
    page.select_option("#id_driver", value="local")
    page.select_option("#id_gpu_model", value="RTX 4090")
    assert page.locator("#id_fault option[value=ecc_uncorrectable]").evaluate("o => o.hidden")
    page.select_option("#id_gpu_model", value="H100")
    assert not page.locator("#id_fault option[value=ecc_uncorrectable]").evaluate("o => o.hidden")

    expect(page.locator("#field-fault_value")).to_be_hidden()
    page.select_option("#id_fault", value="throttled")
    expect(page.locator("#field-fault_value")).to_be_visible()
    expect(page.locator("#field-fault_value label")).to_have_text("CPU share (% of one core)")
    expect(page.locator("#id_fault_value")).to_have_value("20")
    screenshot(page, "host-form-throttled")
