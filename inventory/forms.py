"""Console forms for providers: register, add a fabric, add a host."""

from decimal import Decimal

from django import forms

from inventory.choices import DriverKind, FabricKind
from inventory.drivers import faults as fault_table
from inventory.gpu_catalog import BY_MODEL
from inventory.models import Block, Provider, Site
from inventory.validation import validate_udp_endpoint

# Options read as the fault's name; the page shows the chosen one's description (its title) below.
FAULT_CHOICES = [("", "None: healthy host")] + [(f.name, f.label) for f in fault_table.CATALOG]


class FaultSelect(forms.Select):
    """Each option carries what the page needs to offer it only where it works (see faults.py)."""

    def create_option(self, name, value, *args, **kwargs):
        option = super().create_option(name, value, *args, **kwargs)
        fault = fault_table.BY_NAME.get(str(value))
        if fault is not None:
            models = [m for m in BY_MODEL if fault.applies_to(fault_table.HostKind(m)) is None]
            machine = fault.machine_check() if fault.machine_check else None
            option["attrs"]["data-models"] = "|".join(models) if not machine else ""
            option["attrs"]["title"] = fault.description
            if machine:
                option["attrs"]["disabled"] = True
                option["label"] = f"{option['label']} (unavailable: {machine})"
            if fault.value:
                option["attrs"]["data-value-label"] = fault.value.label
                option["attrs"]["data-min"] = fault.value.minimum
                option["attrs"]["data-max"] = fault.value.maximum
                option["attrs"]["data-default"] = fault.value.default
        return option


class ProviderForm(forms.Form):
    name = forms.CharField(max_length=100)
    contact_email = forms.EmailField(required=False)


class FabricForm(forms.Form):
    site = forms.ModelChoiceField(queryset=Site.objects.all(), required=False, empty_label="— new site —")
    new_site_name = forms.CharField(max_length=100, required=False, help_text="Data center code, e.g. fra2.")
    new_site_region = forms.CharField(max_length=50, required=False, help_text="e.g. eu-central.")
    name = forms.CharField(max_length=100, help_text="e.g. fra2-ib")
    kind = forms.ChoiceField(choices=FabricKind.choices)
    per_host_gbytes_per_s = forms.FloatField(
        required=False,
        min_value=0.01,
        label="Per-host bandwidth (GB/s)",
        help_text="Empty: the kind's default.",
    )
    oversubscription = forms.FloatField(initial=1.0, min_value=1.0)
    blocks = forms.CharField(help_text="Racks / leaf switches, comma-separated, e.g. r01, r02.")

    def clean(self):
        data = super().clean()
        if not data.get("site") and not (data.get("new_site_name") and data.get("new_site_region")):
            self.add_error("site", "Pick a site or give a new site's name and region.")
        data["block_names"] = [b.strip() for b in data.get("blocks", "").split(",") if b.strip()]
        if not data["block_names"]:
            self.add_error("blocks", "Name at least one block.")
        return data


class HostForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="Letters, digits, hyphens: e.g. iad1-h100-07.")
    block = forms.ModelChoiceField(queryset=Block.objects.none(), help_text="Where the host sits.")
    driver = forms.ChoiceField(choices=DriverKind.choices, initial=DriverKind.LOCAL)
    price_per_gpu_hour = forms.DecimalField(
        min_value=Decimal("0"), max_digits=8, decimal_places=2, label="Price per GPU-hour ($)"
    )
    gpu_model = forms.ChoiceField(
        choices=[(m, m) for m in BY_MODEL], required=False, label="GPU model (local)"
    )
    gpu_count = forms.IntegerField(min_value=1, max_value=16, initial=8, required=False, label="GPUs (local)")
    fault = forms.ChoiceField(
        choices=FAULT_CHOICES,
        widget=FaultSelect,
        required=False,
        label="Inject fault (local)",
        help_text="Simulate a broken host to see how onboarding reports it.",
    )
    fault_value = forms.IntegerField(required=False, label="Fault value")
    address = forms.CharField(max_length=255, required=False, help_text="SSH: IP or DNS name.")
    ssh_port = forms.IntegerField(min_value=1, max_value=65535, initial=22, required=False)
    ssh_user = forms.CharField(max_length=64, required=False, initial="root")
    ssh_private_key = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        required=False,
        help_text="OpenSSH private key Volt logs in with; stored encrypted.",
    )
    ssh_host_key = forms.CharField(
        required=False, help_text="Optional `ssh-keyscan` line; empty: pinned on first contact."
    )
    private_address = forms.GenericIPAddressField(
        protocol="IPv4",
        required=False,
        label="Private address (SSH)",
        help_text="Where your other hosts reach this one, if not at the SSH address (a gateway, NAT).",
    )
    overlay_endpoint = forms.CharField(
        required=False,
        max_length=270,
        validators=[validate_udp_endpoint],
        label="Forwarded UDP port (SSH)",
        help_text="Behind NAT: the public ADDRESS:PORT forwarded to this host's UDP port 51820, for clusters "
        "that span networks (WireGuard). Blank: none.",
    )

    def __init__(self, *args, provider: Provider, local: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        if not local:  # the local driver is off here, or for this user (validation.may_add_local_hosts)
            self.fields["driver"].choices = [(DriverKind.SSH, DriverKind.SSH.label)]
            self.fields["driver"].initial = DriverKind.SSH
        self.fields["block"].queryset = Block.objects.filter(fabric__provider=provider).select_related(
            "fabric__site"
        )
        self.fields["block"].label_from_instance = lambda b: (
            f"{b.fabric.site.name} / {b.fabric.name} / {b.name}"
        )

    def _check_fault(self, data: dict) -> None:
        fault = fault_table.BY_NAME.get(data.get("fault") or "")
        if fault is None or not data.get("gpu_model"):
            return
        block = data.get("block")
        kind = fault_table.HostKind(data["gpu_model"], block.fabric.kind if block else "")
        problem = fault.problem(kind, data.get("fault_value"))
        if problem:
            self.add_error(*problem)

    def fault_content(self) -> dict[str, str] | None:
        """The sandbox's fault files for a valid local host form, or None for a healthy host."""
        fault = fault_table.BY_NAME.get(self.cleaned_data.get("fault") or "")
        return {fault.name: fault.content(self.cleaned_data.get("fault_value"))} if fault else None

    def clean(self):
        data = super().clean()
        if data.get("driver") == DriverKind.LOCAL:
            if not data.get("gpu_model"):
                self.add_error("gpu_model", "Local hosts need a GPU model.")
            if not data.get("gpu_count"):
                self.add_error("gpu_count", "Local hosts need a GPU count.")
            self._check_fault(data)
        elif data.get("driver") == DriverKind.SSH:
            if not data.get("address"):
                self.add_error("address", "SSH hosts need an address.")
            if not data.get("ssh_private_key"):
                self.add_error("ssh_private_key", "Paste the private key Volt should log in with.")
        return data
