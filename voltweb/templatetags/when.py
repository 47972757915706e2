"""`{{ value|when }}` → "2025-06-01 14:30:15 UTC", `{{ value|when:"time" }}` → "14:30:15 UTC": the one way
the console writes a moment, 24-hour, with its time zone. Its twin in the browser is `voltWhen(value,
part)` (static/volt/volt.js), for what pages draw live: both write UTC, Volt's TIME_ZONE, so a line
rendered by the server and one added by a websocket event read alike (they mixed "2:28:34 PM" and
"14:30:15" before). Takes a datetime or an ISO 8601 string (records keep some times as strings); anything
else is "" (so `|default:"—"` applies)."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def when(value, part: str = "") -> str:
    moment = _moment(value)
    if moment is None:
        return ""
    moment = moment.astimezone(UTC)
    return moment.strftime("%H:%M:%S UTC" if part == "time" else "%Y-%m-%d %H:%M:%S UTC")


def _moment(value) -> datetime | None:
    if isinstance(value, str) and value:
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # naive: stored as UTC
