"""Filters shared by the host/GPU/offer API endpoints and the console's inventory pages."""

import django_filters
from django import forms
from django.db.models import Q, Value
from django.db.models.functions import Lower, Replace

from inventory.choices import INTERCONNECT_FAMILIES, FabricKind, GpuHealth, HostState
from inventory.gpu_catalog import catalog_matches
from inventory.models import GPU, Host

_FAMILY_LABELS = {"infiniband": "InfiniBand (any)", "roce": "RoCE", "ethernet": "Ethernet (any)"}
INTERCONNECT_CHOICES = [(family, _FAMILY_LABELS.get(family, family)) for family in INTERCONNECT_FAMILIES]
# A family holding one kind has that kind's value ("roce"): listed once, as the family.
INTERCONNECT_CHOICES += [
    (kind, label) for kind, label in FabricKind.choices if kind not in INTERCONNECT_FAMILIES
]


def _filter_interconnect(queryset, field_prefix, value):
    kinds = INTERCONNECT_FAMILIES.get(value, {value})
    return queryset.filter(**{f"{field_prefix}fabric__kind__in": kinds})


def filter_model(queryset, name, value):
    """A family ("A100") or a precise model ("A100-80GB"), as gpu_catalog.model_matches reads it.

    Case-insensitive equality per candidate name, so the UPPER(gpu_model) indexes serve it.
    """
    if not value:
        return queryset
    query = Q()
    for model in catalog_matches(value):
        query |= Q(**{f"{name}__iexact": model})
    return queryset.filter(query)


_MODEL_HELP = 'A family ("A100": every memory size) or a precise model ("A100-80GB", "H100-SXM").'

MAX_ID = 2**63 - 1  # bigint: a larger id overflows the database driver (a 500 before)
MAX_PRICE = 99999  # price_per_gpu_hour has 8 digits, 2 of them decimals


class IdFilter(django_filters.NumberFilter):
    """A database id: a whole number within bigint, else a 400."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class HostFilter(django_filters.FilterSet):
    model = django_filters.CharFilter(
        field_name="gpu_model", method=filter_model, label="GPU model", help_text=_MODEL_HELP
    )
    region = django_filters.CharFilter(field_name="site__region", lookup_expr="iexact", label="Region")
    site = django_filters.CharFilter(field_name="site__name", lookup_expr="iexact", label="Site")
    interconnect = django_filters.ChoiceFilter(
        choices=INTERCONNECT_CHOICES,
        method="filter_interconnect",
        label="Interconnect",
        empty_label="Any",
        help_text="A family (infiniband, roce, ethernet) or a fabric kind (ib_ndr, eth_100g, ...).",
    )
    min_free_gpus = django_filters.NumberFilter(
        field_name="free_gpus", lookup_expr="gte", min_value=0, max_value=1024, label="Min free GPUs"
    )
    max_price = django_filters.NumberFilter(
        field_name="price_per_gpu_hour",
        lookup_expr="lte",
        min_value=0,
        max_value=MAX_PRICE,
        label="Max $ / GPU-hour",
    )
    state = django_filters.ChoiceFilter(choices=HostState.choices, label="State", empty_label="Any")
    provider = django_filters.CharFilter(field_name="provider__slug")
    q = django_filters.CharFilter(method="filter_search", label="Search")

    class Meta:
        model = Host
        fields = [
            "model",
            "region",
            "site",
            "interconnect",
            "min_free_gpus",
            "max_price",
            "state",
            "provider",
        ]

    def filter_interconnect(self, queryset, name, value):
        return _filter_interconnect(queryset, "", value)

    def filter_search(self, queryset, name, value):
        return queryset.filter(
            Q(name__icontains=value) | Q(gpu_model__icontains=value) | Q(site__name__icontains=value)
        )


class OfferFilter(django_filters.FilterSet):
    """Narrows the hosts before aggregation into offers."""

    model = django_filters.CharFilter(
        field_name="gpu_model", method=filter_model, label="GPU model", help_text=_MODEL_HELP
    )
    region = django_filters.CharFilter(field_name="site__region", lookup_expr="iexact", label="Region")
    interconnect = django_filters.ChoiceFilter(
        choices=INTERCONNECT_CHOICES, method="filter_interconnect", label="Interconnect", empty_label="Any"
    )
    min_free_gpus = django_filters.NumberFilter(
        field_name="free_gpus",
        lookup_expr="gte",
        min_value=0,
        max_value=1024,
        label="Min free GPUs on a host",
    )
    max_price = django_filters.NumberFilter(
        field_name="price_per_gpu_hour",
        lookup_expr="lte",
        min_value=0,
        max_value=MAX_PRICE,
        label="Max $ / GPU-hour",
    )

    class Meta:
        model = Host
        fields = ["model", "region", "interconnect", "min_free_gpus", "max_price"]

    def filter_interconnect(self, queryset, name, value):
        return _filter_interconnect(queryset, "", value)


def _filter_model_loosely(queryset, name, value):
    """As a researcher types: "4090", "rtx4090" and "RTX 4090" all find RTX 4090 hosts (case, spaces ignored)."""
    wanted = value.lower().replace(" ", "")
    return queryset.alias(model_key=Replace(Lower("gpu_model"), Value(" "), Value(""))).filter(
        model_key__contains=wanted
    )


def _loose_model_filter() -> django_filters.CharFilter:
    return django_filters.CharFilter(
        method=_filter_model_loosely,
        label="GPU model",
        widget=forms.TextInput(attrs={"list": "gpu-models", "placeholder": "e.g. H100, 4090"}),
    )


class ConsoleHostFilter(HostFilter):
    """The console's host filter: the model matches part of the name (the API keeps exact names)."""

    model = _loose_model_filter()


class ConsoleOfferFilter(OfferFilter):
    """The console's offer filter: the model matches part of the name (the API keeps exact names)."""

    model = _loose_model_filter()


class GpuFilter(django_filters.FilterSet):
    host = IdFilter(field_name="host_id")
    model = django_filters.CharFilter(field_name="model", method=filter_model, help_text=_MODEL_HELP)
    region = django_filters.CharFilter(field_name="host__site__region", lookup_expr="iexact")
    interconnect = django_filters.ChoiceFilter(choices=INTERCONNECT_CHOICES, method="filter_interconnect")
    health = django_filters.ChoiceFilter(choices=GpuHealth.choices)

    class Meta:
        model = GPU
        fields = ["host", "model", "region", "interconnect", "health"]

    def filter_interconnect(self, queryset, name, value):
        return _filter_interconnect(queryset, "host__", value)
