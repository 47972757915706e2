"""Serializer fields that refuse the wrong JSON type instead of coercing it (`regions: [1, 2]` is a 400)."""

import math

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField turns 1 into "1"."""

    default_error_messages = {"not_a_string": "Must be a string, not {kind}."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string", kind=type(data).__name__)
        return super().to_internal_value(data)


class StrictSlugField(StrictCharField, serializers.SlugField):
    """A slug given as a string."""


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: never a string, a boolean or a float like 2.5."""

    default_error_messages = {"not_an_integer": "Must be an integer, not {kind}."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_an_integer", kind=type(data).__name__)
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A finite JSON number: never a string ("NaN", "0.5"), a boolean, or an infinity (1e999 parses to one).

    DRF's FloatField takes the string "NaN", and NaN passes its min/max checks (every comparison is false).
    """

    default_error_messages = {
        "not_a_number": "Must be a number{bounds}, not {kind}.",
        "not_finite": "Must be a finite number{bounds}.",
    }

    def _bounds(self) -> str:
        if self.min_value is not None and self.max_value is not None:
            return f" from {self.min_value:g} to {self.max_value:g}"
        return ""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("not_a_number", bounds=self._bounds(), kind=type(data).__name__)
        if not math.isfinite(data):
            self.fail("not_finite", bounds=self._bounds())
        return super().to_internal_value(data)


class _CallerScoped:
    """A related field that looks objects up only among those the caller may use (`scope(user)`).

    "Exists but not yours" and "does not exist" get the same 400, so the error is no oracle for other
    tenants' objects. `queryset` (the whole table) only describes the field to the schema generator.
    """

    default_error_messages = {"not_yours": "No {noun} {value!r} among yours."}

    def __init__(self, scope, noun: str, **kwargs):
        super().__init__(**kwargs)
        self.scope, self.noun = scope, noun

    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return self.queryset.none()
        return self.scope(request.user)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (str, int)):
            self.fail("incorrect_type", data_type=type(data).__name__)
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            self.fail("not_yours", noun=self.noun, value=data)


class ScopedSlugRelatedField(_CallerScoped, serializers.SlugRelatedField):
    """A slug looked up among the caller's own objects."""

    default_error_messages = {
        **serializers.SlugRelatedField.default_error_messages,
        **_CallerScoped.default_error_messages,
        "incorrect_type": "Must be a slug (string), not {data_type}.",
    }


class ScopedPrimaryKeyRelatedField(_CallerScoped, serializers.PrimaryKeyRelatedField):
    """An id looked up among the caller's own objects."""

    default_error_messages = {
        **serializers.PrimaryKeyRelatedField.default_error_messages,
        **_CallerScoped.default_error_messages,
    }


class ScopedIdField(ScopedPrimaryKeyRelatedField):
    """An id given as a JSON integer (never "7"), looked up among the caller's own objects."""

    default_error_messages = {
        **ScopedPrimaryKeyRelatedField.default_error_messages,
        "incorrect_type": "Must be an integer (a {noun} id), not {data_type}.",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("incorrect_type", noun=self.noun, data_type=type(data).__name__)
        return super().to_internal_value(data)
