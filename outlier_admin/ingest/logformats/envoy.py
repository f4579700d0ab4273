"""Envoy access logs: the default text format and JSON (including Envoy AI Gateway's token fields).

**Default text format** (what Envoy writes with no ``log_format``; Envoy's access-log docs)::

    [%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE%
    %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%
    "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"

``total_ms`` = ``%DURATION%``, ``ts`` = start + duration (every format stamps a record with its end),
node = ``%UPSTREAM_HOST%`` (a ``tcp://`` prefix, as in the docs' example, is dropped), status =
``%RESPONSE_CODE%``, ``request_id`` = ``x-request-id``. No token counts: a latency-only record. No
TTFT: ``x-envoy-upstream-service-time`` is the time to the response *headers*, the first token only
when the response streams, so reading it as a TTFT would make every non-streamed request look as if
it decoded in no time.

**JSON** (``json_format`` access log), one object per line. Fields read (first present alias wins):

- upstream node: ``upstream_host`` (``%UPSTREAM_HOST%``) | ``upstream_address``;
- end time: ``start_time`` (RFC 3339) + ``duration`` ms (``%DURATION%``, total request time);
- ``total_ms``: ``duration``; ``ttft_ms``: ``response_duration`` / ``ttft_ms`` when logged
  (``%RESPONSE_DURATION%`` is the time to the first response byte = first token when streaming);
- tokens: ``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens`` (Envoy AI Gateway), a
  nested OpenAI ``usage`` object, or ``prompt_tokens`` / ``completion_tokens`` / ``input_tokens`` /
  ``output_tokens`` (:func:`.openai.tokens_of`); none: a latency-only record (an MCP call);
- ``status``: ``response_code`` (Envoy logs 0 when no response was sent: a timeout/reset);
- ``request_id``: ``x-request-id``; ``group``: ``group`` when the log carries one.

Lines without an upstream (``null`` / ``-``: no route, local reply) raise ``no_upstream``.
"""

from __future__ import annotations

import re
from typing import Any

from outlier_admin.ingest.logformats import NodeMap, ParseError, default_node, load_object, map_node
from outlier_admin.ingest.logformats.openai import address_of, first, number, tokens_of

NAME = "envoy"
_TTFT = ("response_duration", "ttft_ms")
_Q = r'"(?P<{}>[^"]*)"'
_TEXT = re.compile(
    r'^\[(?P<start>[^\]]+)\] "(?P<request>[^"]*)" (?P<code>\d+) (?P<flags>\S+) (?P<rx>\S+) (?P<tx>\S+) '
    r"(?P<duration>\S+) (?P<ust>\S+) " + " ".join(_Q.format(k) for k in ("xff", "ua", "rid", "authority", "upstream"))
    + r"(?P<rest>.*)$"
)


def _start(value: Any) -> float:
    from outlier_admin.ingest.records import RecordError, parse_ts

    if not isinstance(value, str):
        raise ParseError("missing_start_time", "no start_time (%START_TIME%) in the line", fmt=NAME)
    try:
        return parse_ts(value)
    except RecordError:
        raise ParseError("bad_start_time", f"start_time {value[:40]!r} is not RFC 3339", fmt=NAME) from None


def _node(upstream: Any, node_map: NodeMap | None) -> str:
    node = address_of(upstream) if upstream not in (None, "-") else None
    if not node:
        fallback = default_node(node_map)
        if fallback is None:
            raise ParseError("no_upstream", "no %UPSTREAM_HOST%: the request did not reach a node", fmt=NAME)
        return fallback
    return map_node(node, node_map)


def parse_text(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One line of Envoy's default text format -> ingest record (see module docstring)."""
    m = _TEXT.match(line.strip())
    if m is None:
        raise ParseError("bad_format", "not Envoy's default text access-log format", fmt=NAME)
    g = m.groupdict()
    node = _node(g["upstream"], node_map)
    if not g["duration"].isdigit():
        raise ParseError("no_latency", f"%DURATION% is {g['duration'][:20]!r}", fmt=NAME)
    total_ms = float(g["duration"])
    rid = g["rid"]
    return {
        "ts": _start(g["start"]) + total_ms / 1000.0,
        "node": node,
        "prompt_tokens": None,
        "completion_tokens": None,
        "ttft_ms": None,
        "total_ms": total_ms,
        "status": int(g["code"]),
        "request_id": rid if rid and rid != "-" else None,
    }


def parse_object(obj: dict[str, Any], *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One decoded Envoy JSON access-log object -> ingest record (see module docstring)."""
    node = _node(first(obj, ("upstream_host", "upstream_address")), node_map)
    duration = first(obj, ("duration", "duration_ms"))
    if duration is None:
        raise ParseError("missing_duration", "no duration (%DURATION%) in the line", fmt=NAME)
    total_ms = number(duration, "duration", NAME)
    started = _start(obj.get("start_time"))
    ttft = first(obj, _TTFT)
    status = obj.get("response_code", 200)
    try:
        status = int(status)
    except (TypeError, ValueError):
        raise ParseError("bad_status", f"response_code {str(status)[:40]!r} is not an integer", fmt=NAME) from None
    prompt, completion, cached = tokens_of(obj)
    return {
        "ts": started + total_ms / 1000.0,
        "node": node,
        "group": obj.get("group"),
        "prompt_tokens": None if prompt is None else number(prompt, "prompt_tokens", NAME),
        "completion_tokens": None if completion is None else number(completion, "completion_tokens", NAME),
        "cached_tokens": cached,
        "ttft_ms": None if ttft is None else number(ttft, "ttft_ms", NAME),
        "total_ms": total_ms,
        "status": status,
        "request_id": obj.get("x-request-id"),
    }


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One Envoy access-log line, JSON or the default text format -> ingest record."""
    if line.lstrip().startswith("["):
        return parse_text(line, node_map=node_map)
    return parse_object(load_object(line, reason="bad_json", what="an Envoy JSON access-log line", fmt=NAME),
                        node_map=node_map)
