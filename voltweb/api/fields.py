"""Serializer fields that refuse the wrong JSON type instead of coercing it (`regions: [1, 2]` is a 400)."""

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
