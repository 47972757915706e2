"""Console pages for the inventory: offers, hosts, providers and onboarding."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from inventory import runtimes, services, validation
from inventory.choices import DriverKind, FabricKind, HostState
from inventory.drivers import faults as fault_table
from inventory.drivers.base import DriverError
from inventory.filters import ConsoleHostFilter, ConsoleOfferFilter
from inventory.forms import FabricForm, HostForm, ProviderForm
from inventory.gpu_catalog import BY_MODEL
from inventory.models import Provider
from voltweb.services import is_platform_admin
from voltweb.statemachine import IllegalTransition

HOST_SORTS = {
    "price": "price_per_gpu_hour",
    "-price": "-price_per_gpu_hour",
    "free": "free_gpus",
    "-free": "-free_gpus",
    "name": "name",
    "-name": "-name",
    "reliability": "reliability",
    "-reliability": "-reliability",
}
PAGE_SIZE = 25


@login_required
def offers(request):
    hosts = services.visible_hosts(request.user)
    filterset = ConsoleOfferFilter(request.GET, queryset=hosts)
    rows = services.offers(filterset.qs if filterset.is_valid() else hosts.none())
    kinds = dict(FabricKind.choices)
    for row in rows:
        row["fabric_label"] = kinds.get(row["fabric_kind"], row["fabric_kind"])
    chart = _offers_chart(rows)
    context = {
        "filter": filterset,
        "offers": rows,
        "chart_json": json.dumps(chart),
        "gpu_models": list(BY_MODEL),
    }
    return render(request, "inventory/offers.html", context)


def _offers_chart(rows: list[dict]) -> dict:
    """Free GPUs per model, one bar series per region (drawn by Plotly in the page)."""
    regions = sorted({r["region"] for r in rows})
    models = sorted({r["gpu_model"] for r in rows})
    series = []
    for region in regions:
        counts = {m: 0 for m in models}
        for r in rows:
            if r["region"] == region:
                counts[r["gpu_model"]] += r["free_gpus"]
        series.append({"type": "bar", "name": region, "x": models, "y": [counts[m] for m in models]})
    return {"data": series, "layout": {"barmode": "group", "height": 260}}


@login_required
def hosts(request):
    queryset = services.visible_hosts(request.user).select_related("provider", "site", "fabric", "block")
    filterset = ConsoleHostFilter(request.GET, queryset=queryset)
    sort = request.GET.get("sort", "price")
    rows = filterset.qs if filterset.is_valid() else queryset.none()
    rows = rows.order_by(HOST_SORTS.get(sort, "price_per_gpu_hour"), "id")
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    sort_query = query.copy()
    sort_query.pop("sort", None)
    context = {
        "filter": filterset,
        "page": page,
        "sort": sort,
        "query": query.urlencode(),
        "sort_query": sort_query.urlencode(),
        "managed": services.managed_provider_ids(request.user),
        "gpu_models": list(BY_MODEL),
    }
    return render(request, "inventory/hosts.html", context)


def _host_context(request, pk):
    host = get_object_or_404(
        services.visible_hosts(request.user).select_related("provider", "site", "fabric", "block"), pk=pk
    )
    manages = services.can_manage_provider(request.user, host.provider)
    actions = [
        a
        for a in services.HOST_ACTIONS
        if services.host_action_possible(host, a)
        and (manages or services.may_act_on_host(request.user, host, a))
    ]
    drill = services.drill_keeping_out(host)
    return {
        "host": host,
        "manages": manages,
        "actions": actions,
        "drill_note": drill.note(host.get_state_display().lower()) if drill else "",
        "gpus": host.gpus.all(),
        "ports": host.ports.all() if manages else [],
        "events": services.host_history(host)[:50] if manages else [],
        "in_progress": host.state == HostState.ONBOARDING
        or (host.runtime or {}).get("state") in ("queued", "installing"),
        "system_pythons": _pythons(host.system or {}),
        "runtime_summary": runtimes.summary(host.runtime) if (host.runtime or {}).get("versions") else "",
        "may_install_runtime": manages
        and runtimes.needs_runtime(host)
        and host.state in runtimes.KEPT_STATES,
    }


def _pythons(system: dict) -> list[tuple[str, str]]:
    """Each Python version on the host once, with the paths that run it (python3 and python3.11 are often
    the same interpreter): [("3.11.7", "/usr/bin/python3, /usr/bin/python3.11")]."""
    paths: dict[str, list[str]] = {}
    for entry in system.get("pythons") or []:
        paths.setdefault(str(entry.get("version", "")), []).append(str(entry.get("path", "")))
    return [(version, ", ".join(found)) for version, found in paths.items()]


@login_required
def host_detail(request, pk):
    context = _host_context(request, pk)
    host = context["host"]
    if context["manages"] and host.driver == DriverKind.LOCAL:
        context["faults"] = services.active_faults(host)
        context["fault_choices"] = [f.name for f in fault_table.CATALOG if not f.at_creation_only]
        context["added_with"] = {f.name for f in fault_table.CATALOG if f.at_creation_only}
        context["links_note"] = services.unavailable_reason()
        context["links_scale"] = f"{services.bandwidth_scale(DriverKind.LOCAL):g}"
    return render(request, "inventory/host_detail.html", context)


def _managed_host(request, pk):
    """A host of a provider the user manages; 404 for any other (visible or not)."""
    host = get_object_or_404(services.visible_hosts(request.user).select_related("provider"), pk=pk)
    if not services.can_manage_provider(request.user, host.provider):
        raise Http404("No such host among yours.")
    return host


@login_required
@require_POST
def host_faults(request, pk):
    """Inject (`fault`, `value`) into or clear (`clear`) a fault of a local host the user manages."""
    host = _managed_host(request, pk)
    clear, fault = request.POST.get("clear", ""), request.POST.get("fault", "")
    try:
        if clear:
            services.clear_host_fault(host, clear, actor=request.user)
            messages.success(request, f"{host.name}: fault {clear} cleared.")
        else:
            services.inject_fault(host, fault, request.POST.get("value", "").strip(), actor=request.user)
            messages.success(request, f"{host.name}: fault {fault} injected.")
    except (ValueError, DriverError) as exc:
        messages.error(request, str(exc))
    return redirect("inventory:host", pk=host.pk)


@login_required
def host_status(request, pk):
    """The live part of the host page, re-fetched by htmx when the websocket says something changed."""
    return render(request, "inventory/_host_status.html", _host_context(request, pk))


@login_required
@require_POST
def host_runtime(request, pk):
    """Install (or verify) Volt's runtime on an SSH host the user manages; a worker does it."""
    host = _managed_host(request, pk)
    try:
        runtimes.queue_install(host, actor=request.user)
        messages.success(request, f"{host.name}: Volt's runtime is being installed; the page follows it.")
    except runtimes.RuntimeRefused as exc:
        messages.error(request, str(exc))
    return redirect("inventory:host", pk=host.pk)


@login_required
@require_POST
def host_action(request, pk, action):
    host = get_object_or_404(services.visible_hosts(request.user).select_related("provider"), pk=pk)
    if action not in services.HOST_ACTIONS or not services.may_act_on_host(request.user, host, action):
        raise Http404("No such action on a host you manage.")
    try:
        host = services.act_on_host(host, action, request.user, request.POST.get("reason", ""))
        if host.state == HostState.ONBOARDING:
            # A worker takes it from here (it may be done by the time the page loads): no state to promise.
            messages.success(request, f"{host.name}: onboarding started; the page follows it as it goes.")
        else:
            messages.success(request, f"{host.name}: {action} done; state is now {host.get_state_display()}.")
    except IllegalTransition as exc:
        messages.error(request, f"{exc} Refresh the page to see the current state.")
    except validation.HostRefused as exc:
        messages.error(request, exc.message)
    return redirect("inventory:host", pk=host.pk)


@login_required
def providers(request):
    rows = services.visible_providers(request.user)
    managed = services.managed_provider_ids(request.user)
    return render(request, "inventory/providers.html", {"providers": rows, "managed": managed})


@login_required
def provider_new(request):
    form = ProviderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            provider = services.register_provider(request.user, **form.cleaned_data)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(
                request,
                f"{provider.name} registered. A platform admin will review it; meanwhile you can "
                "describe your fabrics, and add hosts once it is approved.",
            )
            return redirect("inventory:provider", slug=provider.slug)
    return render(request, "inventory/provider_form.html", {"form": form})


def _managed_provider(request, slug) -> Provider:
    provider = get_object_or_404(services.visible_providers(request.user), slug=slug)
    if not services.can_manage_provider(request.user, provider):
        raise Http404("No such provider among yours.")
    return provider


@login_required
def provider_detail(request, slug):
    provider = get_object_or_404(services.visible_providers(request.user), slug=slug)
    manages = services.can_manage_provider(request.user, provider)
    hosts = (
        services.visible_hosts(request.user)
        .filter(provider=provider)
        .select_related("site", "fabric", "block")
    )
    fabrics = provider.fabrics.select_related("site").prefetch_related("blocks")
    context = {
        "provider": provider,
        "manages": manages,
        "hosts": hosts,
        "port_shortfalls": services.port_shortfalls(hosts) if manages else (),
        "fabrics": fabrics,
        "platform_admin": is_platform_admin(request.user),
    }
    return render(request, "inventory/provider_detail.html", context)


@login_required
@require_POST
def provider_review(request, slug):
    provider = get_object_or_404(Provider, slug=slug)
    if not is_platform_admin(request.user):
        raise Http404("Only platform admins review providers.")
    approve = request.POST.get("decision") == "approve"
    try:
        services.review_provider(provider, approve)
        messages.success(request, f"{provider.name} is now {provider.get_status_display().lower()}.")
    except IllegalTransition as exc:
        messages.error(request, str(exc))
    return redirect("inventory:providers")


@login_required
def fabric_new(request, slug):
    provider = _managed_provider(request, slug)
    form = FabricForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        site = data["site"] or services.get_or_create_site(data["new_site_name"], data["new_site_region"])
        try:
            services.create_fabric(
                provider,
                site,
                data["name"],
                data["kind"],
                data["per_host_gbytes_per_s"],
                data["oversubscription"],
                data["block_names"],
            )
        except ValidationError as exc:
            form.add_error(None, exc.messages)
        else:
            messages.success(
                request, f"Fabric {data['name']} with {len(data['block_names'])} block(s) added."
            )
            return redirect("inventory:provider", slug=provider.slug)
    return render(request, "inventory/fabric_form.html", {"form": form, "provider": provider})


@sensitive_post_parameters("ssh_private_key")
@login_required
def host_new(request, slug):
    provider = _managed_provider(request, slug)
    try:
        validation.check_provider_approved(provider)
    except validation.HostRefused as exc:
        messages.error(request, exc.message)
        return redirect("inventory:provider", slug=provider.slug)
    form = HostForm(
        request.POST or None, provider=provider, local=validation.may_add_local_hosts(request.user)
    )
    if not form.fields["block"].queryset.exists():
        messages.info(request, "Describe a fabric and its racks first: hosts are placed in a block.")
        return redirect("inventory:fabric-new", slug=provider.slug)
    if request.method == "POST" and form.is_valid():
        try:
            host = services.add_host(provider, _host_request(form), actor=request.user)
        except validation.HostRefused as exc:
            form.add_error("driver" if exc.code.startswith("local") else None, exc.message)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"{host.name} added and onboarding started; this page follows it live.")
            return redirect("inventory:host", pk=host.pk)
    return render(request, "inventory/host_form.html", {"form": form, "provider": provider})


def _host_request(form: HostForm) -> services.HostRequest:
    data = form.cleaned_data
    local = data["driver"] == DriverKind.LOCAL
    spec = (
        services.default_local_spec(data["gpu_model"], data["gpu_count"], data["block"].fabric.kind)
        if local
        else None
    )
    faults = form.fault_content() if local else None
    return services.HostRequest(
        name=data["name"],
        block=data["block"],
        driver=data["driver"],
        price_per_gpu_hour=data["price_per_gpu_hour"],
        address=data.get("address") or "",
        ssh_port=data.get("ssh_port") or 22,
        ssh_user=data.get("ssh_user") or "",
        ssh_private_key=data.get("ssh_private_key") or "",
        ssh_host_key=data.get("ssh_host_key") or "",
        private_address=data.get("private_address") or None,
        overlay_endpoint=data.get("overlay_endpoint") or "",
        local_spec=spec,
        local_faults=faults,
    )
