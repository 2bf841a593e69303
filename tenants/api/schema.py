"""OpenAPI description of Camp's bearer-token authentication."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token created in the console or at /api/v1/tokens/ (camp_…).",
        }


# --- Error responses ------------------------------------------------------------------------
# drf-spectacular documents only the success response of each operation; these are the
# error bodies every Camp endpoint can answer (tenants/api/exceptions.py shapes them).
# Added by a postprocessing hook rather than per view so no endpoint can forget them.

_DETAIL = {
    "type": "object",
    "description": "An error not tied to one field.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
_FIELD_ERRORS = {
    "type": "object",
    "description": (
        "Input errors: each key names a field (or a query parameter, or `non_field_errors`); "
        "its value lists the messages (nested fields nest the same way)."
    ),
    "additionalProperties": {"anyOf": [
        {"type": "array", "items": {}},
        {"type": "object"},
        {"type": "string"},
    ]},
}
_ERRORS: dict[str, tuple[str, str]] = {
    "400": ("FieldErrors", "Invalid input: the body names each bad field or parameter."),
    "401": ("ErrorDetail", "Not authenticated: no valid session or API token."),
    "403": ("ErrorDetail", "Authenticated, but this role may not do this (or the token is read-only)."),
    "404": ("ErrorDetail", "No such object visible to you (another tenant's objects are 404 too), "
                           "or a page past the end."),
    "415": ("ErrorDetail", "The request body's content type is not JSON, form or multipart."),
    "422": ("FieldErrors", "This Idempotency-Key was already used with a different request body."),
}


def _has_input(op: dict[str, Any]) -> bool:
    return "requestBody" in op or any(p.get("in") in ("query", "header", "path")
                                      for p in op.get("parameters", []))


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool
                    ) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry: the error responses of every operation."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorDetail", _DETAIL)
    schemas.setdefault("FieldErrors", _FIELD_ERRORS)
    for path_item in result.get("paths", {}).values():
        for method, op in path_item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            wanted = ["401", "403", "404"]
            if _has_input(op):
                wanted.append("400")
            if "requestBody" in op:
                wanted.append("415")
            if any(p.get("name") == "Idempotency-Key" for p in op.get("parameters", [])):
                wanted.append("422")
            responses = op.setdefault("responses", {})
            for code in sorted(wanted):
                name, description = _ERRORS[code]
                responses.setdefault(code, {
                    "description": description,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
                })
    return result
