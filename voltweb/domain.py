"""Domain errors: a refusal raised by a service, carrying the code and HTTP status the API answers with.

Services raise them; the API's one exception handler (voltweb/api/errors.py) translates every one, so no
view maps them by hand (NetBox's dispatch does the same). Console views show `str(exc)` as a flash.
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the domain refuses as it stands; the message says why and what to do."""

    code = "conflict"
    status = 409
