"""Console forms for providers: register, add a fabric, add a host."""

from decimal import Decimal

from django import forms

from inventory.choices import DriverKind, FabricKind
from inventory.drivers.local import FAULTS
from inventory.gpu_catalog import BY_MODEL
from inventory.models import Block, Provider, Site

FAULT_CHOICES = [("", "None: healthy host")] + [(f, f.replace("_", " ")) for f in FAULTS]


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
        required=False,
        label="Inject fault (local)",
        help_text="Simulate a broken host to see how onboarding reports it.",
    )
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

    def clean(self):
        data = super().clean()
        if data.get("driver") == DriverKind.LOCAL:
            if not data.get("gpu_model"):
                self.add_error("gpu_model", "Local hosts need a GPU model.")
            if not data.get("gpu_count"):
                self.add_error("gpu_count", "Local hosts need a GPU count.")
        elif data.get("driver") == DriverKind.SSH:
            if not data.get("address"):
                self.add_error("address", "SSH hosts need an address.")
            if not data.get("ssh_private_key"):
                self.add_error("ssh_private_key", "Paste the private key Volt should log in with.")
        return data
