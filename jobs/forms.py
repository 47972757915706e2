"""The console's submit form: the demo workload, or an entrypoint with an uploaded working dir."""

from django import forms

KINDS = [("demo", "Demo workload (data-parallel training shipped with Volt)"), ("custom", "My entrypoint")]


class JobForm(forms.Form):
    kind = forms.ChoiceField(choices=KINDS, initial="demo", widget=forms.RadioSelect, label="Workload")
    name = forms.CharField(max_length=100, required=False)
    # The demo's fields are sent only while the demo is chosen (their fieldset is disabled otherwise).
    steps = forms.IntegerField(min_value=1, max_value=100000, initial=60, required=False,
                               help_text="Demo: training steps.")  # fmt: skip
    seed = forms.IntegerField(
        min_value=0, max_value=2**31 - 1, initial=0, required=False, help_text="Demo: seed."
    )
    step_sleep = forms.FloatField(min_value=0, max_value=10, initial=0.2, required=False,
                                  help_text="Demo: seconds per step, to watch it live.")  # fmt: skip
    checkpoint_every = forms.IntegerField(min_value=1, max_value=1_000_000, initial=10,
                                          help_text="Steps between checkpoints.")  # fmt: skip
    entrypoint = forms.CharField(max_length=2000, required=False, help_text="e.g. python train.py --lr 0.1")
    working_dir = forms.FileField(required=False, help_text=".zip or .tar.gz of your job's folder.")
    env = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One NAME=value per line.",
    )  # fmt: skip

    def clean(self):
        data = super().clean()
        if data.get("kind") == "demo":
            for name in ("steps", "seed"):
                if data.get(name) is None and name not in self.errors:
                    self.add_error(name, "Required for the demo workload.")
        return data

    def env_dict(self) -> dict[str, str]:
        env = {}
        for number, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip():
                continue
            if "=" not in line:
                self.add_error("env", f"Line {number}: write NAME=value.")
                continue
            name, value = line.split("=", 1)
            env[name.strip()] = value
        return env

    def to_payload(self, cluster_id: int) -> dict:
        """The API's submission body for this form (validated by the API serializer)."""
        data = self.cleaned_data
        payload = {"cluster": cluster_id, "name": data.get("name") or "", "env": self.env_dict(),
                   "checkpoint_every": data["checkpoint_every"]}  # fmt: skip
        if data["kind"] == "demo":
            payload.update(
                demo=True, steps=data["steps"], seed=data["seed"], step_sleep=data.get("step_sleep") or 0
            )
        else:
            payload.update(entrypoint=data.get("entrypoint") or "", working_dir=data.get("working_dir"))
        return payload
