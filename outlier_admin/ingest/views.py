"""``POST /api/v1/ingest/requests``: HTTP push of request records (token scope ``ingest``).

A plain Django view rather than DRF: it is the hot path (tens of thousands of records per second)
and its error contract is fixed by the issue. Responses are JSON:

- 200 ``{"accepted": n, "rejected": n, "duplicates": n, "errors": [{"line": i, "reason": "..."}]}``
  (``line`` is 1-based: the array element or the NDJSON line; only the first errors are listed;
  every refusal is counted by reason, and a few samples of each reason are stored with their
  counts, :mod:`outlier_admin.ingest.pipeline`); a record for a group outside a scoped token's
  groups is one such refusal (``group_out_of_scope``), the rest of the batch goes on;
- 429 + ``Retry-After`` the token is over one of its limits (requests in progress, body bytes a
  second: :mod:`outlier_admin.ingest.throttle`); nothing of the body was read or applied;
- 400 body is neither JSON nor NDJSON; 401 no / unknown / revoked token (or its user deactivated)
  or wrong scope; 405 not POST; 413 body over ``INGEST_MAX_BODY_BYTES``, or more records (array
  elements, NDJSON lines) than ``INGEST_MAX_LINES`` (``max_lines`` in the body); 415 content type not JSON/NDJSON;
  503 + ``Retry-After`` Redis or PostgreSQL unreachable, or (``REDIS_MIN_REPLICAS_ACK``) no Redis replica
  acknowledged the rows in time (retry the whole body); 500 an error of ours
  (nothing was accepted: retry the whole body). A batch is never half-applied with a 5xx: see
  :mod:`outlier_admin.ingest.pipeline`. Chunked bodies are read.

Every error body is the API's one shape, an RFC 9457 problem (:mod:`outlier_admin.api.errors`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from outlier_admin.control.redis_conn import UNAVAILABLE_ERRORS, NotReplicated, require_replicas
from outlier_admin.fleet.auth import lookup_token, token_from_header
from outlier_admin.fleet.models import ApiToken, TokenScope
from outlier_admin.ingest import throttle
from outlier_admin.ingest.pipeline import submit
from outlier_admin.outage import DB_OUTAGE_ERRORS

log = logging.getLogger(__name__)

# Seconds a client should wait before retrying after a 503 (Redis or PostgreSQL unreachable).
RETRY_AFTER_S = 2
JSON_TYPES = {"application/json"}
NDJSON_TYPES = {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"}


def _json(status: int, payload: dict[str, Any], **headers: str) -> HttpResponse:
    if status >= 400:  # the API's one error shape: an RFC 9457 problem (outlier_admin.api.errors)
        from django.urls import reverse

        from outlier_admin.problem import problem_response

        extra = {k: v for k, v in payload.items() if k != "error"}
        resp = problem_response(status, payload["error"], instance=reverse("ingest-requests"), **extra)
    else:
        resp = HttpResponse(orjson.dumps(payload), status=status, content_type="application/json")
    for key, value in headers.items():
        resp[key.replace("_", "-")] = value
    return resp


#: What orjson refuses that the standard library reads (its error message names it): a number past a
#: double, a lone surrogate escape, the NaN / Infinity literals. Any other line orjson refuses is not
#: JSON at all.
_STDLIB_READS = ("infinity", "surrogate", "literal")


class BodyError(ValueError):
    pass


def _loads(text: bytes) -> Any:
    """JSON -> Python. orjson first (the hot path); valid JSON it refuses — a number beyond a double
    (``1e400``), a lone surrogate escape (``"\\ud800"``) — is parsed by the standard library, so one
    such record is rejected on its own (``bad_total_ms``: not finite) instead of the whole body
    being answered 400. Raises ``ValueError`` for text that is not JSON (nesting past Python's limit
    included)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if not any(word in str(exc) for word in _STDLIB_READS):
            raise  # not JSON to either parser: no second, slower parse of a garbage line
        try:
            return json.loads(text)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
        except UnicodeDecodeError as exc:
            raise ValueError(str(exc)) from None


class TooManyLines(BodyError):
    """More records in a body than ``INGEST_MAX_LINES`` (answered 413, naming the cap)."""


def count_lines(body: bytes) -> int:
    """The lines of an NDJSON body, blank ones included: counted on the bytes (one pass in C), so a
    body is refused for its size in lines before a single line becomes a Python object."""
    return body.count(b"\n") + (not body.endswith(b"\n"))


def split_body(body: bytes, content_type: str, *, max_lines: int) -> Iterator[tuple[int, Any, bytes | None]]:
    """Body -> ``(line, record_or_ParseError, raw)``. A JSON array gives one item per element; NDJSON
    (or a JSON body that is not one document) one per non-empty line, parsed as the items are taken
    (:func:`~outlier_admin.ingest.pipeline.submit` takes them a chunk at a time), so a line that is
    refused never outlives its chunk. Raises :class:`TooManyLines` past ``max_lines`` records (before
    any line is parsed, for NDJSON), :class:`BodyError` for a body that is not JSON: at once for an
    empty body or a JSON document of the wrong kind, from the iterator when its last line is taken
    and none was JSON (nothing has been applied then: submit applies at its end)."""
    if not body.strip():
        raise BodyError("empty body")
    if content_type in JSON_TYPES:
        try:
            doc = _loads(body)
        except ValueError:
            doc = None  # maybe NDJSON sent as application/json (curl -d @file)
        else:
            if isinstance(doc, list):
                if len(doc) > max_lines:
                    raise TooManyLines(f"the body holds {len(doc)} records, over the limit of {max_lines} "
                                       "records per request (INGEST_MAX_LINES): send smaller batches")
                return ((i + 1, rec, None) for i, rec in enumerate(doc))
            if isinstance(doc, dict):
                return iter([(1, doc, None)])
            raise BodyError("a JSON body must be an array of records or one record object")
    lines = count_lines(body)
    if lines > max_lines:
        raise TooManyLines(f"the body holds {lines} lines, over the limit of {max_lines} records per request "
                           "(INGEST_MAX_LINES): send smaller batches")
    return _ndjson(body)


def _ndjson(body: bytes) -> Iterator[tuple[int, Any, bytes | None]]:
    from contract.logformats import ParseError

    parsed = 0
    start, i, end = 0, 0, len(body)
    while start < end:  # line by line without a list of every line (bytes.split would make one)
        stop = body.find(b"\n", start)
        if stop < 0:
            stop = end
        line = body[start:stop]
        start = stop + 1
        i += 1
        if not line.strip():
            continue
        try:
            item = (i, _loads(line), None)
            parsed += 1
        except ValueError as exc:
            item = (i, ParseError("bad_json", str(exc)[:200]), line)
        yield item
    if parsed == 0:
        raise BodyError("the body is neither a JSON array nor NDJSON (no line is valid JSON)")


def _read_body(request: HttpRequest, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the body. ``request.read()``, not ``request.body``: ``.body``
    enforces DATA_UPLOAD_MAX_MEMORY_SIZE instead of our limit. A chunked body (``Transfer-Encoding:
    chunked``, no ``Content-Length``: what streaming shippers send) is read from the WSGI input itself,
    which the server has de-chunked: Django's request stream stops at ``Content-Length``, so it would
    read such a body as empty."""
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    if chunked and not request.META.get("CONTENT_LENGTH"):
        stream = request.META["wsgi.input"]
        parts, size = [], 0
        while size <= limit:
            part = stream.read(min(65536, limit + 1 - size))
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)
    return request.read(limit + 1)


@csrf_exempt
def ingest_requests(request: HttpRequest) -> HttpResponse:
    try:
        return _ingest_requests(request)
    except (*UNAVAILABLE_ERRORS, *DB_OUTAGE_ERRORS) as exc:
        # Redis (the stream; or its cluster slot is moving) or PostgreSQL (tokens, groups, nodes, rejected
        # records) is unreachable:
        # refuse the body rather than accept and drop it. Nothing was applied (the pipeline's point of
        # acceptance is one MULTI/EXEC inside the SQL transaction), so the client retries the body.
        log.warning("ingest refused with 503: %s: %s", type(exc).__name__, exc)
        return _json(503, {"error": "storage unavailable: the records were not accepted, retry later",
                           "retry_after_s": RETRY_AFTER_S}, Retry_After=str(RETRY_AFTER_S))
    except Exception:
        # A fault of ours before the point of acceptance: nothing was applied; say so (a client
        # must be able to tell "retry this whole body" from "some records went in").
        log.exception("ingest failed before accepting the batch")
        return _json(500, {"error": "internal error: no record of this body was accepted; retry it"})


def _ingest_requests(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _json(405, {"error": "method not allowed: POST records here"}, Allow="POST")
    plaintext = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
    token = lookup_token(plaintext) if plaintext else None
    if token is None:
        return _json(401, {"error": "missing, unknown or revoked bearer token"}, WWW_Authenticate="Bearer")
    if token.scope != TokenScope.INGEST:
        return _json(401, {"error": f"token scope is {token.scope!r}; this endpoint needs 'ingest'"},
                     WWW_Authenticate="Bearer")
    try:
        with throttle.request_slot(token.pk, token.name):
            return _take_body(request, token)
    except throttle.Throttled as exc:
        return _json(429, {"error": exc.detail, "limit": exc.limit, "retry_after_s": exc.retry_after_s},
                     Retry_After=str(exc.retry_after_s))


def _take_body(request: HttpRequest, token: ApiToken) -> HttpResponse:
    limit = settings.INGEST_MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return _json(413, {"error": f"body of {declared} bytes is over the limit of {limit} bytes"})
    body = _read_body(request, limit)
    if len(body) > limit:
        return _json(413, {"error": f"body is over the limit of {limit} bytes"})
    throttle.take_bytes(token.pk, token.name, len(body))
    if not body.strip():
        return _json(400, {"error": "empty body: send a JSON array or NDJSON of records"})
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    if content_type not in JSON_TYPES | NDJSON_TYPES:
        return _json(415, {"error": f"content type {content_type or 'none'!r} not supported; "
                                    "use application/json (array) or application/x-ndjson"})
    max_lines = settings.INGEST_MAX_LINES
    try:
        items = split_body(body, content_type, max_lines=max_lines)
        outcome = submit(items, source=f"http:{token.name}", group_scope=token.group_scope())
    except TooManyLines as exc:
        return _json(413, {"error": str(exc), "max_lines": max_lines})
    except BodyError as exc:
        return _json(400, {"error": str(exc)})
    if outcome.accepted or outcome.duplicates:
        # 200 only once a replica holds the rows (REDIS_MIN_REPLICAS_ACK; nothing when 0). Duplicates
        # too: they may be a retry of a body whose first answer was this 503, still on the primary only.
        try:
            require_replicas()
        except NotReplicated as exc:
            log.warning("ingest answered 503: %s", exc)
            return _json(503, {"error": "the records are not yet on a Redis replica; retry the body (records "
                                        "with a request_id are counted once)", "retry_after_s": RETRY_AFTER_S},
                         Retry_After=str(RETRY_AFTER_S))
    return _json(200, outcome.to_dict())
