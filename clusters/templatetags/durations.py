"""`{{ seconds|duration_text }}`: 4h 30m, 45m, 20s (clusters/durations.py)."""

from django import template

from clusters import durations

register = template.Library()


@register.filter
def duration_text(seconds) -> str:
    return durations.describe(float(seconds or 0))
