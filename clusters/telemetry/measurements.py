"""Measured figures from outside Volt: nccl-tests `all_reduce_perf` output a provider ran on its own hosts.

Issue 23, item 7. A provider admin (of the hosts' provider) or a platform admin uploads the output as it
was printed, with the hosts it ran on; Volt keeps it as a BandwidthSample of the domain those hosts span,
shown as "measured by the provider" beside Volt's own figures (clusters/templatetags/measured.py)::

    POST /api/v1/bandwidth-samples/ {"hosts": [12, 13], "output": "# nThread 1 nGpus 1 ..."}
      └─ record_provider_run(user, host_ids, output)
           ├─ who: a provider admin or a platform admin (else 403 not_allowed)
           ├─ the hosts: each one the caller manages, not retired, all of one approved provider
           │    (else 400 unknown_hosts / retired_hosts / several_providers, 403 provider_not_approved)
           ├─ inventory.discovery.nccl_tests.parse_all_reduce: the header, the device list, the
           │    out-of-place / in-place table, the footer (else 400 unreadable_output naming the line)
           ├─ the run against the hosts: as many machines as hosts named, no more GPUs than they have
           │    (else 400 hosts_mismatch)
           └─ BandwidthSample(source=provider): level and domain the hosts span (one host: "host"), busbw at
              the largest size, Volt's own prediction for those hosts beside it

Placement uses such a figure only as services.measured_bandwidth says: a provider's block or fabric,
where Volt measured nothing itself, and never above Volt's prediction.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from clusters import placement
from clusters.choices import BandwidthSource
from clusters.models import BandwidthSample
from clusters.planning import snapshots_of
from inventory import services as inventory
from inventory.choices import DriverKind, HostState, ProviderStatus
from inventory.discovery.nccl_tests import AllReduceRun, parse_all_reduce
from inventory.discovery.types import ParseError
from inventory.models import Host
from voltweb import services as accounts
from voltweb.domain import DomainError

MAX_HOSTS = 512


class MeasurementRefused(DomainError):
    """An upload Volt will not keep; `code` names the rule, `status` the HTTP answer."""

    def __init__(self, message: str, code: str, status: int = 400):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


def may_upload(user: AbstractBaseUser) -> bool:
    """Provider admins (for their own hosts) and platform admins."""
    return accounts.is_platform_admin(user) or bool(inventory.managed_provider_ids(user))


def record_provider_run(user: AbstractBaseUser, host_ids: list[int], output: str) -> BandwidthSample:
    """Keep the all-reduce figure of `output` (nccl-tests all_reduce_perf, as printed) for `host_ids`.

    Raises MeasurementRefused saying what to change: who may upload, which hosts, which line of the
    output is not what it should be."""
    if not may_upload(user):
        raise MeasurementRefused(
            "Only a provider admin of the hosts' provider, or a platform admin, uploads measured figures.",
            "not_allowed",
            403,
        )
    hosts = _hosts(user, host_ids)
    try:
        run = parse_all_reduce(output)
    except ParseError as exc:
        raise MeasurementRefused(
            f"Not all_reduce_perf output Volt can read: {exc}", "unreadable_output"
        ) from None
    _check_run_matches(run, hosts)
    return _store(user, hosts, run)


def _hosts(user: AbstractBaseUser, host_ids: list[int]) -> list[Host]:
    wanted = list(dict.fromkeys(host_ids))
    if not wanted or len(wanted) > MAX_HOSTS:
        raise MeasurementRefused(f"Name from 1 to {MAX_HOSTS} hosts the run used.", "invalid")
    found = {h.pk: h for h in _managed(user).filter(pk__in=wanted).select_related("provider", "site")}
    unknown = [str(pk) for pk in wanted if pk not in found]
    if unknown:
        raise MeasurementRefused(f"No host {', '.join(unknown)} among the hosts you manage.", "unknown_hosts")
    hosts = [found[pk] for pk in wanted]
    retired = [h.name for h in hosts if h.state == HostState.RETIRED]
    if retired:
        raise MeasurementRefused(f"{', '.join(retired)}: retired, nothing to measure.", "retired_hosts")
    providers = {h.provider for h in hosts}
    if len(providers) > 1:
        names = ", ".join(sorted(p.name for p in providers))
        raise MeasurementRefused(f"Upload one provider's hosts at a time ({names}).", "several_providers")
    provider = providers.pop()
    if provider.status != ProviderStatus.APPROVED and not accounts.is_platform_admin(user):
        raise MeasurementRefused(
            f"{provider.name} is {provider.get_status_display().lower()}: it acts once approved.",
            "provider_not_approved",
            403,
        )
    return hosts


def _managed(user: AbstractBaseUser) -> QuerySet[Host]:
    return Host.objects.all() if accounts.is_platform_admin(user) else inventory.managed_hosts(user)


def _check_run_matches(run: AllReduceRun, hosts: list[Host]) -> None:
    machines = run.hostnames
    if len(machines) != len(hosts):
        raise MeasurementRefused(
            f"The output's ranks ran on {len(machines)} machine(s) ({', '.join(machines)}) but "
            f"{len(hosts)} host(s) were named: name exactly the hosts the run used.",
            "hosts_mismatch",
        )
    gpus = sum(h.gpu_count for h in hosts)
    if len(run.ranks) > gpus:
        raise MeasurementRefused(
            f"The output lists {len(run.ranks)} GPUs; the hosts named have {gpus}.", "hosts_mismatch"
        )


def _store(user: AbstractBaseUser, hosts: list[Host], run: AllReduceRun) -> BandwidthSample:
    level, domain, predicted = _domain(hosts)
    largest = run.largest
    return BandwidthSample.objects.create(
        level=level,
        domain_id=domain,
        busbw_gbps=run.busbw_gbps,
        nodes=len(hosts),
        source=BandwidthSource.PROVIDER,
        predicted_gbps=predicted,
        uploaded_by=user if user.is_authenticated else None,
        source_local=any(h.driver == DriverKind.LOCAL for h in hosts),
        details={
            "tool": "nccl-tests all_reduce_perf",
            "hosts": [h.pk for h in hosts],
            "host_names": [h.name for h in hosts],
            "machines": list(run.hostnames),
            "ranks": len(run.ranks),
            "gpus": list(run.gpu_names),
            "largest_bytes": largest.size_bytes,
            "out_of_place_busbw_gbps": largest.out_of_place_busbw,
            "in_place_busbw_gbps": largest.in_place_busbw,
            "average_busbw_gbps": run.average_busbw_gbps,
        },
    )


def _domain(hosts: list[Host]) -> tuple[str, str, float | None]:
    """(level, domain id, Volt's predicted busbw) of the hosts: one host is its own domain ("host"); more
    span their lowest common level, keyed as the probe keys its samples (placement.bandwidth.measured_key)."""
    if len(hosts) == 1:
        return "host", str(hosts[0].pk), None
    snapshots = snapshots_of(Host.objects.filter(pk__in=[h.pk for h in hosts]))
    level = placement.lowest_common_level(snapshots)
    key = snapshots[0].path.domain(level)
    return str(level), key[-1] if key else "", placement.cluster_busbw_gbps(snapshots)


# --- what the pages show -------------------------------------------------------------------------------

SHOWN = 10  # newest figures per page


def figures_of_host(host: Host) -> list[dict]:
    """The newest measured figures of `host` and of the block, fabric, site and region it sits in."""
    where = {
        ("host", str(host.pk)): f"this host ({host.name})",
        ("block", str(host.block_id)): f"block {host.block.name}",
        ("fabric", str(host.fabric_id)): f"fabric {host.fabric.name}",
        ("site", str(host.site_id)): f"site {host.site.name}",
        ("region", host.site.region): f"region {host.site.region}",
    }
    return _figures(where)


def figures_of_cluster(cluster) -> list[dict]:
    """The newest measured figures of the domain a cluster's plan spans (one node: its host), its own
    probe's included."""
    plan = cluster.plan or {}
    level, domain = plan.get("spanned_level"), plan.get("spanned_domain") or []
    if not level:
        return []
    key = (str(level), str(domain[-1]) if domain else "")
    return _figures({key: f"this cluster's {level}"})


def _figures(where: dict[tuple[str, str], str]) -> list[dict]:
    match = Q()
    for level, domain in where:
        match |= Q(level=level, domain_id=domain)
    samples = BandwidthSample.objects.filter(match).order_by("-measured_at", "-pk")[:SHOWN]
    return [{"sample": s, "where": where[(s.level, s.domain_id)]} for s in samples]
