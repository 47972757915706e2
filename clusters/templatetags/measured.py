"""`{% measured_figures_of_host host %}` and `{% measured_figures_of_cluster cluster %}`: the measured
all-reduce figures of a host's domains or of a cluster's span, Volt's own and those the provider uploaded
(issue 23), each saying who measured it. The host page (an inventory template) shows them through this tag:
the inventory app imports nothing of the clusters app."""

from __future__ import annotations

from django import template

from clusters.telemetry import measurements

register = template.Library()


@register.inclusion_tag("clusters/_measured.html")
def measured_figures_of_host(host) -> dict:
    return {"figures": measurements.figures_of_host(host), "subject": "this host's domains"}


@register.inclusion_tag("clusters/_measured.html")
def measured_figures_of_cluster(cluster) -> dict:
    return {"figures": measurements.figures_of_cluster(cluster), "subject": "the domain this cluster spans"}
