"""The API's JSON parser: a body that is too large, too deep or carries a NUL byte is a 400, not a 500."""

from __future__ import annotations

import json

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32  # Volt's deepest request (a host's local_spec.nics[].field) is 4 levels


def check_value(value, depth: int = 0) -> None:
    """Raise ParseError if `value` nests deeper than MAX_DEPTH or any string in it holds a NUL byte."""
    if depth > MAX_DEPTH:
        raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.")
    if isinstance(value, str):
        if "\x00" in value:
            raise ParseError("A JSON string contains a NUL character (\\u0000); remove it.")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_value(key, depth + 1)
            check_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_value(item, depth + 1)


class StrictJSONParser(JSONParser):
    """JSONParser bounded in size (DATA_UPLOAD_MAX_MEMORY_SIZE) and depth, refusing NUL characters.

    DRF reads the request stream itself, which bypasses Django's own body-size check, so the limit is
    applied here as well as in voltweb.middleware.InputGuardMiddleware (which trusts Content-Length).
    """

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError(f"The request body is larger than {limit} bytes.")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(raw.decode(encoding), parse_constant=_no_constant)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        check_value(data)
        return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
