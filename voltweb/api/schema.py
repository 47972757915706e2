"""OpenAPI description of Volt's bearer-token authentication."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "voltweb.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token from the console's API tokens page or `manage.py create_api_token`.",
        }


# Every operation may answer these with the one error shape (voltweb.api.errors): input errors (400: also
# bad filters and hostile input refused by voltweb.middleware), authentication (401), permission (403),
# not found / not yours (404, also an out-of-range page), and throttling (429). POST, PUT, PATCH and
# DELETE may also meet a state conflict (409).
ERROR_STATUSES = {
    "400": "Invalid input: `error.fields` names each field and what is wrong with it.",
    "401": "No credentials, or an invalid, expired or revoked token.",
    "403": "Authenticated, but not allowed to do this.",
    "404": "No such object, or not yours (the same answer, by design).",
    "429": "Too many requests; retry after the Retry-After header's seconds.",
}
WRITE_ERROR_STATUSES = {"409": "The object's state does not allow this now (e.g. an illegal transition)."}
ERROR_COMPONENT = "VoltError"


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: document the error responses every operation can give.

    Declaring them per view drifted from what the views answer (schemathesis found undocumented 400,
    403, 404 and 409), so they are added in one place, each with the same schema.
    """
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR_COMPONENT] = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Machine-readable, e.g. invalid, not_found."},
                    "message": {"type": "string", "description": "What went wrong and what to do."},
                    "fields": {
                        "type": "object",
                        "additionalProperties": {},
                        "description": "Per-field messages for invalid input.",
                    },
                },
                "required": ["code", "message"],
            }
        },
        "required": ["error"],
    }
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            statuses = dict(ERROR_STATUSES)
            if method in ("post", "put", "patch", "delete"):
                statuses |= WRITE_ERROR_STATUSES
            responses = operation.setdefault("responses", {})
            for status, description in statuses.items():
                responses.setdefault(
                    status, {"description": description, "content": {"application/json": {"schema": ref}}}
                )
    return result
