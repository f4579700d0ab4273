"""drf-spectacular extensions: the bearer-token scheme, the error responses of every operation (each an
RFC 9457 problem, ``application/problem+json``: :mod:`outlier_admin.api.errors`), and the ingest
endpoint (a plain Django view that DRF's schema generator cannot see).

Everything below that states a rule reads it from its owner at schema-generation time, so the schema
cannot drift from the code: the record bounds from :func:`outlier_admin.ingest.columns.limits` (the
``INGEST_*`` settings), the required fields from :data:`~contract.normalize.REQUIRED`, the
name patterns and lengths from :mod:`contract.names`, the content types and ``Retry-After``
from :mod:`outlier_admin.ingest.views`, the database outage's ``Retry-After`` from
:mod:`outlier_admin.outage`, and the ingest path from the URL configuration.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from outlier_admin.api.errors import PROBLEM_CONTENT_TYPE

#: The security scheme of the ingest endpoint (an ingest-scope token, not a user's API token).
INGEST_SCHEME = "ingestToken"
PROBLEM = "Problem"
PROBLEM_ERROR = "ProblemError"
INGEST_RECORD = "IngestRecord"
INGEST_RESULT = "IngestResult"
METHODS = ("get", "put", "post", "patch", "delete", "head", "options", "trace")


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "outlier_admin.fleet.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `manage.py create_token --scope api --name N --user USERNAME`. "
            "It acts as that user, with that user's role.",
        }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_response(description: str, schema: str, **headers: dict[str, Any]) -> dict[str, Any]:
    """A documented response; an error (schema :data:`PROBLEM`) as ``application/problem+json``."""
    media_type = PROBLEM_CONTENT_TYPE if schema == PROBLEM else "application/json"
    out: dict[str, Any] = {"description": description, "content": {media_type: {"schema": _ref(schema)}}}
    if headers:
        out["headers"] = {name.replace("_", "-"): header for name, header in headers.items()}
    return out


def _header(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "schema": schema, "required": True}


def _ecma_pattern(pattern: re.Pattern[str]) -> str:
    """A Python name regex as a JSON Schema (ECMA 262) pattern. Ours use only syntax both share
    (anchors, classes, bounded repeats); anything else would be a schema that lies, so refuse it."""
    text = pattern.pattern
    if re.search(r"\(\?[P#aiLmsux]|\\[AZz]", text):  # named groups, inline flags, \A \Z \z
        raise ValueError(f"name pattern {text!r} uses Python-only regex syntax")
    # The names module fullmatches; a JSON Schema pattern searches, so anchor it here.
    return f"^(?:{text})$"


# --- the API's one error shape (outlier_admin.api.errors) -------------------------------------------------

def _error_schemas() -> dict[str, Any]:
    from outlier_admin.api.errors import DEFAULT_CODES

    return {
        PROBLEM: {
            "type": "object",
            "description": "Every error of the API, the ingest endpoint included: an RFC 9457 problem "
            "(`application/problem+json`). `detail` is one readable sentence; `errors` lists each fault with "
            "a stable `code` and the input at fault in `attr` (null: the request as a whole).",
            "properties": {
                "type": {"type": "string", "description": "`about:blank`: the problem is what the status says"},
                "title": {"type": "string", "description": "the HTTP status phrase"},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string"},
                "instance": {"type": "string", "description": "the path of the request"},
                "errors": {"type": "array", "items": _ref(PROBLEM_ERROR)},
                "retry_after_s": {"type": "integer", "minimum": 1,
                                  "description": "with a 503: seconds before retrying (also `Retry-After`)"},
            },
            "required": ["type", "title", "status", "detail", "errors"],
        },
        PROBLEM_ERROR: {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "e.g. `required`, `invalid`, `refused`, `too_large`, "
                         f"`unknown_filter`, or the status's own: {', '.join(f'`{c}`' for c in DEFAULT_CODES.values())}"},
                "detail": {"type": "string"},
                "attr": {"type": "string", "nullable": True,
                         "description": "the field or query parameter at fault (nested: dotted)"},
            },
            "required": ["code", "detail", "attr"],
        },
    }


def _api_error_responses(operation: dict[str, Any]) -> dict[str, Any]:
    """The errors any DRF operation can answer besides its success: see :mod:`outlier_admin.api.errors`
    (400), the permission classes of :mod:`outlier_admin.api.permissions` (401/403), and
    :mod:`outlier_admin.outage` (503)."""
    from outlier_admin.outage import RETRY_AFTER_S

    params = operation.get("parameters", [])
    has_body = "requestBody" in operation
    out: dict[str, Any] = {}
    if has_body or any(p.get("in") == "query" for p in params):
        out["400"] = _json_response("Invalid input: a field, a filter, a range or a refused action", PROBLEM)
    out["401"] = _json_response(
        "No credentials, or an unknown, revoked or malformed bearer token", PROBLEM,
        WWW_Authenticate=_header("the scheme to authenticate with", {"type": "string"}))
    out["403"] = _json_response("The account's role may not do this, or the token has scope `ingest`", PROBLEM)
    if any(p.get("in") == "path" for p in params):
        out["404"] = _json_response("No such object", PROBLEM)
    if has_body:
        out["413"] = _json_response("The request body is over `DATA_UPLOAD_MAX_MEMORY_SIZE`", PROBLEM)
        out["415"] = _json_response("Unsupported content type of the request body", PROBLEM)
    out["500"] = _json_response("A fault of ours (reported to the server's log); nothing was changed", PROBLEM)
    out["503"] = _json_response(
        "PostgreSQL is unreachable: nothing was read or changed; retry after `Retry-After` seconds", PROBLEM,
        Retry_After=_header("seconds", {"type": "integer", "minimum": 1, "example": RETRY_AFTER_S}))
    return out


# --- the ingest endpoint (outlier_admin.ingest.views) --------------------------------------------------

#: What the records contract's table does not say about a numeric field: whether it may be null, and
#: what it means. Its type and bounds come from the table (:func:`contract.records.json_schema`).
_RECORD_NUMBERS: dict[str, tuple[bool, str]] = {
    "prompt_tokens": (True, "bounded by `INGEST_MAX_PROMPT_TOKENS`; without both token counts the record is "
                      "latency-only (judged against its peers by latency alone)"),
    "completion_tokens": (True, "bounded by `INGEST_MAX_COMPLETION_TOKENS`; see `prompt_tokens`"),
    "cached_tokens": (True, "prompt tokens served from the prefix cache (OpenAI's "
                      "`usage.prompt_tokens_details.cached_tokens`), {rule}"),
    "total_ms": (False, "total latency (ms), bounded by `INGEST_MAX_LATENCY_MS`"),
    "ttft_ms": (True, "time to first token (ms), {rule}; 0: under the gateway's resolution; null or absent: "
                "unknown"),
    "queue_ms": (True, "the model server's wait for a batch slot inside TTFT (ms), {rule}: TTFT minus it is a "
                 "queue-free prefill time; null or absent: unknown"),
    "status": (False, "HTTP status, or 0 for a timeout / connection failure"),
}


def _record_numbers(bounds: dict[str, Any]) -> dict[str, Any]:
    """The record's numeric properties: the contract's table, with :data:`_RECORD_NUMBERS`'s words."""
    from contract.records import DEFAULT_STATUS, Limits, bound_in_words, json_schema

    generated = json_schema(Limits(**bounds))
    out = {}
    for name, (nullable, text) in _RECORD_NUMBERS.items():
        prop = dict(generated[name])
        if nullable:
            prop["nullable"] = True
        if name == "status":
            prop["default"] = DEFAULT_STATUS
        prop["description"] = text.format(rule=bound_in_words(name))
        out[name] = prop
    return out


def _ingest_schemas() -> dict[str, Any]:
    from contract import names
    from contract.normalize import REQUIRED
    from outlier_admin.ingest.columns import limits
    from outlier_admin.ingest.pipeline import MAX_ERRORS_REPORTED

    bounds = limits()
    record = {
        "type": "object",
        "description": "One finished request as a gateway saw it. Each record is judged on its own: one that "
        "breaks a rule is rejected with a reason code (counted in `rejected`, stored with its raw text), the "
        "others are accepted. The bounds below are the records contract's (`contract.records.FIELDS`); a "
        "bound naming another field is that field's value. Numbers may also be sent as numeric strings. "
        "Unknown fields are ignored.",
        "properties": {
            "ts": {
                "description": "When the request finished: epoch seconds, or RFC 3339 with a time zone. At "
                f"most {bounds['max_future_s']:g} s in the future (`INGEST_MAX_FUTURE_S`) and "
                f"{bounds['retention_s']:g} s in the past (`INGEST_RETENTION_S`).",
                "oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}],
            },
            "node": {
                "type": "string", "minLength": 1, "maxLength": names.NODE_ID_MAX,
                "pattern": _ecma_pattern(names.NODE_ID_RE),
                "description": "The node's id or address in the group (an id, never a URL). An unknown "
                "node is rejected, or registered when `AUTO_REGISTER_NODES` is on and its address is in the "
                "group's allow-list.",
            },
            "group": {
                "type": "string", "minLength": 1, "maxLength": names.GROUP_NAME_MAX,
                "pattern": _ecma_pattern(names.GROUP_NAME_RE), "nullable": True,
                "description": "The model group; it must exist (operators create groups). Optional when the "
                "node is registered in exactly one group.",
            },
            **_record_numbers(bounds),
            "request_id": {"type": "string", "maxLength": 200, "nullable": True,
                           "description": "printable; a repeated id (within `INGEST_DEDUP_WINDOW_S`) is "
                           "counted as a duplicate, not streamed twice"},
        },
        "required": list(REQUIRED),
    }
    result = {
        "type": "object",
        "description": "What happened to each record: `accepted + rejected + duplicates` is the number of "
        "records in the body (array elements, or non-empty NDJSON lines).",
        "properties": {
            "accepted": {"type": "integer", "minimum": 0},
            "rejected": {"type": "integer", "minimum": 0},
            "duplicates": {"type": "integer", "minimum": 0},
            "errors": {
                "type": "array", "maxItems": MAX_ERRORS_REPORTED,
                "description": f"the first {MAX_ERRORS_REPORTED} rejected records (all are stored)",
                "items": {
                    "type": "object",
                    "properties": {
                        "line": {"type": "integer", "minimum": 1,
                                 "description": "1-based: the array element or the NDJSON line"},
                        "reason": {"type": "string", "description": "a reason code, e.g. `bad_total_ms`, "
                                   "`unknown_group`, `unknown_node`, `ts_too_old`"},
                    },
                    "required": ["line", "reason"],
                },
            },
        },
        "required": ["accepted", "rejected", "duplicates", "errors"],
    }
    return {INGEST_RECORD: record, INGEST_RESULT: result}


def _ingest_operation() -> dict[str, Any]:
    from django.conf import settings

    from outlier_admin.ingest import views

    retry = {"type": "integer", "minimum": 1, "example": views.RETRY_AFTER_S}
    ndjson = sorted(views.NDJSON_TYPES)
    body_schema = {"oneOf": [{"type": "array", "items": _ref(INGEST_RECORD)}, _ref(INGEST_RECORD)]}
    content: dict[str, Any] = {t: {"schema": body_schema} for t in sorted(views.JSON_TYPES)}
    # NDJSON: one record per line (OpenAPI 3.0 has no itemSchema for sequential media types).
    content.update({t: {"schema": {"type": "array", "items": _ref(INGEST_RECORD)}} for t in ndjson})
    return {
        "operationId": "v1_ingest_requests_create",
        "summary": "Push request records (gateways, log shippers)",
        "description": (
            (views.__doc__ or "").strip()
            + f"\n\nContent types: {', '.join(sorted(views.JSON_TYPES))} (an array of records or one record) "
            f"or NDJSON ({', '.join(ndjson)}: one record per line). Body at most "
            f"`INGEST_MAX_BODY_BYTES` = {settings.INGEST_MAX_BODY_BYTES} bytes."
        ),
        "tags": ["ingest"],
        "security": [{INGEST_SCHEME: []}],
        "requestBody": {"required": True, "content": content},
        "responses": {
            "200": _json_response("The body was judged record by record", INGEST_RESULT),
            "400": _json_response("The body is empty, or neither JSON nor NDJSON", PROBLEM),
            "401": _json_response(
                "No, unknown or revoked token, or a token whose scope is not `ingest`", PROBLEM,
                WWW_Authenticate=_header("`Bearer`", {"type": "string"})),
            "405": _json_response("Not POST", PROBLEM, Allow=_header("`POST`", {"type": "string"})),
            "413": _json_response("The body is over `INGEST_MAX_BODY_BYTES`", PROBLEM),
            "415": _json_response("The content type is neither JSON nor NDJSON", PROBLEM),
            "500": _json_response("A fault of ours: no record was accepted; retry the whole body",
                                  PROBLEM),
            "503": _json_response(
                "Redis or PostgreSQL is unreachable: no record was accepted; retry the whole body after "
                "`Retry-After` seconds", PROBLEM, Retry_After=_header("seconds", retry)),
        },
    }


def postprocess_schema(result: dict[str, Any], generator: Any = None, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``): documents
    the error responses of every DRF operation and adds the ingest endpoint, its schemas and its
    security scheme."""
    from django.urls import reverse

    components = result.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(_error_schemas())
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method in METHODS:
                for code, response in _api_error_responses(operation).items():
                    operation["responses"].setdefault(code, response)
    schemas.update(_ingest_schemas())
    components.setdefault("securitySchemes", {})[INGEST_SCHEME] = {
        "type": "http", "scheme": "bearer",
        "description": "An ingest token: `manage.py create_token --scope ingest --name GATEWAY`. It may only "
        "push records here; an API token is refused (401).",
    }
    result.setdefault("paths", {})[reverse("ingest-requests")] = {"post": _ingest_operation()}
    return result
