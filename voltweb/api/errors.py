"""One JSON shape for every API error: {"error": {"code", "message", "fields"?}}."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, serializers
from rest_framework.views import exception_handler as drf_exception_handler

from voltweb.domain import DomainError


class ServiceError(exceptions.APIException):
    """A domain refusal raised by a service, shown to the caller with its code."""

    status_code = 409
    default_code = "conflict"

    def __init__(self, message: str, code: str | None = None, status_code: int | None = None):
        super().__init__(message, code or self.default_code)
        if status_code is not None:
            self.status_code = status_code


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            msg = _first_message(value)
            return msg if key in ("non_field_errors", "detail") else f"{key}: {msg}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def exception_handler(exc, context):
    if isinstance(exc, DomainError):  # a service's refusal: its own code and status, one place for all
        exc = ServiceError(str(exc), code=exc.code, status_code=exc.status)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(getattr(exc, "message_dict", None) or exc.messages)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    if isinstance(exc, exceptions.ValidationError):
        body = {"code": "invalid", "message": _first_message(detail), "fields": detail}
    else:
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
        code = codes if isinstance(codes, str) else getattr(exc, "default_code", "error")
        message = detail.get("detail", detail) if isinstance(detail, dict) else detail
        body = {"code": code, "message": str(message)}
    response.data = {"error": body}
    return response


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(
        help_text="Machine-readable code, e.g. invalid, not_found, not_authenticated."
    )
    message = serializers.CharField(help_text="What went wrong and what to do about it.")
    fields = serializers.DictField(required=False, help_text="Per-field messages for invalid input.")


class ErrorResponseSerializer(serializers.Serializer):
    error = ErrorSerializer()
