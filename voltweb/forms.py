from django import forms


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. “github-actions nightly”.")


class TeamQuotaForm(forms.Form):
    """A platform admin's form on the teams page: every limit optional (empty: no limit)."""

    max_gpus = forms.IntegerField(
        required=False, min_value=0, label="GPUs in use at most", help_text="Empty: no cap."
    )
    gpu_model_caps = forms.CharField(
        required=False,
        max_length=500,
        label="Per GPU model",
        help_text="e.g. “H100=8, A100-80GB=4” (a family caps its variants). Empty: none.",
    )
    gpu_hours_per_month = forms.IntegerField(
        required=False,
        min_value=0,
        label="GPU-hours per month",
        help_text="Calendar month, UTC. Empty: none.",
    )

    @staticmethod
    def initial_for(quota) -> dict:
        if quota is None:
            return {}
        caps = ", ".join(f"{model}={cap}" for model, cap in (quota.gpu_model_caps or {}).items())
        return {
            "max_gpus": quota.max_gpus,
            "gpu_model_caps": caps,
            "gpu_hours_per_month": quota.gpu_hours_per_month,
        }

    def clean_gpu_model_caps(self) -> dict[str, str]:
        caps = {}
        for item in filter(None, (part.strip() for part in self.cleaned_data["gpu_model_caps"].split(","))):
            model, sep, cap = item.rpartition("=")
            if not sep or not model.strip() or not cap.strip():
                raise forms.ValidationError(f"Write each cap as MODEL=GPUS (e.g. H100=8), not “{item}”.")
            caps[model.strip()] = cap.strip()
        return caps
