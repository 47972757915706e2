"""`{% cluster_goodput cluster %}` and `{% job_goodput job %}`: the goodput ledger (jobs/goodput.py) as a
stacked bar and a table, on the cluster's and the job's pages."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django import template
from django.utils import timezone

from clusters.models import Cluster
from jobs import goodput

register = template.Library()
LABELS = {
    "productive": "Productive",
    "queued": "Queued",
    "provisioning": "Provisioning / start-up",
    "verification": "Verification",
    "checkpoint_save": "Checkpoint save",
    "recovery": "Recovery",
    "lost_work": "Lost work",
    "idle": "Idle",
    "teardown": "Teardown",
}
COLOURS = {
    "productive": "#2e7d32", "queued": "#9e9e9e", "provisioning": "#5c6bc0", "verification": "#7e57c2",
    "checkpoint_save": "#f9a825", "recovery": "#ef6c00", "lost_work": "#c62828", "idle": "#bdbdbd",
    "teardown": "#757575",
}  # fmt: skip


def _context(context, ledger: dict, what: str, *, plotly: bool) -> dict:
    wall = ledger["wall_s"] or 0.0
    rows = [
        {
            "key": key, "label": LABELS[key], "seconds": ledger["seconds"][key],
            "gpu_hours": ledger["gpu_hours"][key],
            "share": 100.0 * ledger["seconds"][key] / wall if wall else 0.0,
        }
        for key in goodput.CATEGORIES
        if ledger["seconds"][key] > 0
    ]  # fmt: skip
    chart = {
        "data": [
            {"type": "bar", "orientation": "h", "name": row["label"], "y": [what], "x": [row["seconds"] / 60],
             "marker": {"color": COLOURS[row["key"]]},
             "hovertemplate": f"{row['label']}: %{{x:.1f}} min ({row['share']:.1f}%)<extra></extra>"}
            for row in rows
        ],
        "layout": {"barmode": "stack", "height": 150, "margin": {"t": 10, "r": 10, "b": 40, "l": 60},
                   "xaxis": {"ticksuffix": " min"}, "legend": {"orientation": "h", "y": -0.45},
                   "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"},
    }  # fmt: skip
    useful = goodput.useful_fraction(ledger["gpu_hours"])
    return {
        "request": context.get("request"), "what": what, "load_plotly": plotly, "data_id": f"{what}-goodput-data", "ledger": ledger, "rows": rows, "chart": chart,
        "useful_pct": None if useful is None else 100.0 * useful,
        "total_gpu_hours": sum(ledger["gpu_hours"].values()),
        "end_text": (ledger["end"] or "")[:19].replace("T", " "),
    }  # fmt: skip


@register.inclusion_tag("jobs/_goodput.html", takes_context=True)
def cluster_goodput(context, cluster):
    # After the live section, which loads Plotly already.
    return _context(context, goodput.cluster_ledger(cluster), "cluster", plotly=False)


@register.inclusion_tag("jobs/_goodput.html", takes_context=True)
def job_goodput(context, job):
    return _context(context, goodput.job_ledger(job), "job", plotly=True)


@register.simple_tag
def goodput_of_teams(teams, days: int = 30) -> dict:
    """Every listed team's GPU-hours per UTC day over the last `days`, read at once (the teams page: its
    queries do not grow with the teams): {"days": days, "report": by_day's}, for `team_goodput`."""
    now = timezone.now()
    since = datetime.combine(now.date() - timedelta(days=days - 1), time(), tzinfo=UTC)
    return {"days": days, "report": goodput.by_day(Cluster.objects.filter(team__in=teams), since, now, now)}


@register.inclusion_tag("jobs/_team_goodput.html")
def team_goodput(figures: dict, team):
    """One team's card section from `goodput_of_teams`: a chart of GPU-hours per day, stacked by category
    (the page draws every `.goodput-days` chart once Plotly is loaded)."""
    mine = next((row for row in figures["report"]["teams"] if row["team"] == team.slug), None)
    rows = mine["days"] if mine else []
    totals = mine["totals"]["gpu_hours"] if mine else {}
    chart = {
        "data": [
            {"type": "bar", "name": LABELS[key], "x": [row["day"] for row in rows],
             "y": [row["gpu_hours"][key] for row in rows], "marker": {"color": COLOURS[key]}}
            for key in goodput.CATEGORIES
            if any(row["gpu_hours"][key] for row in rows)
        ],
        "layout": {"barmode": "stack", "height": 220, "margin": {"t": 10, "r": 10, "b": 40, "l": 50},
                   "yaxis": {"title": {"text": "GPU-hours"}}, "legend": {"orientation": "h", "y": -0.3},
                   "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"},
    }  # fmt: skip
    useful = goodput.useful_fraction(totals) if totals else None
    return {
        "team": team, "days": figures["days"], "chart": chart, "has_data": bool(chart["data"]),
        "data_id": f"goodput-days-{team.slug}", "total": sum(totals.values()) if totals else 0.0,
        "useful_pct": None if useful is None else 100.0 * useful,
    }  # fmt: skip
