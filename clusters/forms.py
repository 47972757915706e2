"""The console's cluster request form (the same fields as the API's ClusterSpecSerializer)."""

from django import forms

from clusters import locality
from clusters.choices import ConstraintMode, ModelPolicy, Parallelism, TopologyLevel
from inventory.filters import INTERCONNECT_CHOICES
from inventory.gpu_catalog import BY_MODEL, FAMILIES

# A family ("H100") takes any of its variants; it reads as such beside them (the walk saw "H100" and
# "H100-SXM" side by side, as if the same GPU were listed twice).
MODEL_CHOICES = [(m, f"{m} (any variant)" if m in FAMILIES else m) for m in BY_MODEL]


class ClusterForm(forms.Form):
    name = forms.SlugField(max_length=100, initial="my-cluster")
    team = forms.ChoiceField(choices=())
    nodes = forms.IntegerField(min_value=1, max_value=1024, initial=2)
    gpus_per_node = forms.IntegerField(min_value=1, max_value=16, initial=8, label="GPUs per node")
    gpu_models = forms.MultipleChoiceField(
        choices=MODEL_CHOICES,
        initial=["H100"],
        widget=forms.CheckboxSelectMultiple,
        label="GPU models",
    )
    model_policy = forms.ChoiceField(choices=ModelPolicy.choices, initial=ModelPolicy.ANY_OF)
    parallelism = forms.ChoiceField(
        choices=Parallelism.choices, initial=Parallelism.DATA_PARALLEL, label="Workload"
    )
    interconnect = forms.ChoiceField(choices=[("", "Any")] + INTERCONNECT_CHOICES, required=False)
    interconnect_mode = forms.ChoiceField(choices=ConstraintMode.choices, initial=ConstraintMode.PREFERRED)
    topology_level = forms.ChoiceField(
        choices=[("", "No constraint")] + list(TopologyLevel.choices), required=False
    )
    topology_mode = forms.ChoiceField(choices=ConstraintMode.choices, initial=ConstraintMode.PREFERRED)
    regions = forms.CharField(required=False, help_text="Comma-separated, e.g. us-east, eu-west. Empty: any.")
    max_price_per_gpu_hour = forms.DecimalField(
        min_value=0, max_digits=8, decimal_places=2, required=False, label="Max $ / GPU-hour"
    )
    priority = forms.IntegerField(min_value=-100, max_value=100, initial=0)
    duration = forms.CharField(
        required=False,
        label="Duration",
        help_text="How long you need it, e.g. 4h or 2d: Volt warns before the end, then terminates it unless "
        "you extend it. Empty: until you terminate it.",
    )
    wait_for_locality = forms.CharField(
        required=False,
        label="Wait for locality",
        help_text="e.g. site:30m (one site for up to 30 min, then anywhere, with a warning); several: "
        "block:10m, site:30m. Empty: the default (multi-node training waits for one site); none: never.",
    )

    def __init__(self, *args, teams=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(t.slug, t.name) for t in teams]

    def clean_wait_for_locality(self):
        text = (self.cleaned_data.get("wait_for_locality") or "").strip()
        if not text:
            return None
        if text.lower() == "none":
            return []
        try:
            return [locality.parse_wait(part) for part in text.split(",") if part.strip()]
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_duration(self):
        text = (self.cleaned_data.get("duration") or "").strip()
        if not text:
            return None
        try:
            return locality.parse_duration(text, maximum=30 * 86400)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def to_payload(self) -> dict:
        """The API payload for this form's cleaned data."""
        data = dict(self.cleaned_data)
        data["duration_s"] = data.pop("duration", None)
        data["interconnect"] = [data["interconnect"]] if data.get("interconnect") else []
        if not data["interconnect"]:
            data["interconnect_mode"] = ConstraintMode.ANY
        if not data.get("topology_level"):
            data["topology_level"], data["topology_mode"] = None, ConstraintMode.ANY
        elif data["topology_mode"] == ConstraintMode.ANY:
            data["topology_mode"] = ConstraintMode.PREFERRED
        data["regions"] = [r.strip() for r in (data.get("regions") or "").split(",") if r.strip()]
        return {k: v for k, v in data.items() if v is not None}
