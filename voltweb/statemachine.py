"""The one guarded-transition routine every lifecycle in Volt uses (CONVENTIONS.md "State").

An app declares its table `{from_state: {to_state: "why this edge exists"}}` and calls `apply()`;
the update is conditional on the current state (the Healthchecks claim pattern), so two workers
racing to move the same object cannot both succeed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from django.db import models, transaction

from voltweb.domain import DomainError


class IllegalTransition(DomainError):
    """The object is not in a state from which the requested move is allowed (API: 409)."""

    code = "illegal_transition"

    def __init__(self, obj: models.Model, current: str, target: str):
        self.obj, self.current, self.target = obj, current, target
        label = obj._meta.verbose_name
        super().__init__(f"{label} {obj.pk} cannot go from {current} to {target}. It is {current}.")


def allowed_from(table: Mapping[str, Mapping[str, str]], target: str) -> set[str]:
    return {source for source, targets in table.items() if target in targets}


def apply(
    obj: models.Model,
    target: str,
    table: Mapping[str, Mapping[str, str]],
    *,
    field: str = "state",
    extra: dict | None = None,
    record: Callable[[str, str], None] | None = None,
    after_commit: Callable[[], None] | None = None,
    where: dict | None = None,
) -> models.Model:
    """Move `obj` to `target` if its current stored state allows it; raise IllegalTransition otherwise.

    `where`: field values the stored row must still have (e.g. the Ray submission a poll asked about), else
    IllegalTransition: a decision taken on what was read before the row moved on is not applied over it.
    `extra` fields are written in the same UPDATE; `record(previous, target)` writes the timeline event in
    the same transaction; `after_commit` runs once the transaction commits (broadcasts).
    """
    sources = allowed_from(table, target)
    model = type(obj)
    with transaction.atomic():
        rows = model.objects.select_for_update().filter(pk=obj.pk, **(where or {}))
        current = rows.values_list(field, flat=True).first()
        if current is None and where and model.objects.filter(pk=obj.pk).exists():
            current = "(changed since it was read)"
        if current is None or current not in sources:
            raise IllegalTransition(obj, current or "(deleted)", target)
        values = {field: target, **(extra or {})}
        updated = model.objects.filter(pk=obj.pk, **{field: current}).update(**values)
        if updated != 1:
            raise IllegalTransition(obj, current, target)
        for name, value in values.items():
            setattr(obj, name, value)
        if record is not None:
            record(current, target)
        if after_commit is not None:
            transaction.on_commit(after_commit)
    return obj
