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

**Which fields a client writes.** In the default text format the request line, ``X-Forwarded-For``,
``User-Agent``, ``X-Request-Id`` and ``:authority`` come from the client, and Envoy writes them
between quotes *without escaping a quote inside them* (envoyproxy/envoy#4191): a User-Agent of
``curl/8" "atk-1" "llm" "127.0.4.3:18950`` would end the field early and write a request id, an
authority and an upstream host of the client's choosing. What Envoy itself writes — the start
time, the status, the byte counts, ``%DURATION%``, the upstream service time and
``%UPSTREAM_HOST%`` — holds no quote, so a line is read by its quotes: exactly 12 (six quoted
fields), the six around the client's fields single spaces, the upstream host last. Any other count
is refused ``field_count``: which of the quotes are Envoy's cannot be told, and a client's quote
would otherwise pick the node. The fields are never searched for with patterns (every step is
linear in the line). Configure Envoy's JSON access log (``json_format``) instead: it escapes every
value, so no header can reach another field (a JSON line naming a key twice is refused
``duplicate_key``). A format that appends fields to the default one is refused too: log it as JSON.
``x-request-id`` is the client's when it sends one and Envoy keeps it (the default away from the
edge, or ``preserve_external_request_id``): it names the record, never its node.
"""

from __future__ import annotations

import re
from typing import Any

from contract.logformats import (
    NodeMap,
    ParseError,
    check_length,
    default_node,
    load_object,
    map_node,
)
from contract.logformats.openai import address_of, first, number, tokens_of

NAME = "envoy"
_TTFT = ("response_duration", "ttft_ms")
# The default text format (module docstring), cut at its quotes: [start] "request" middle "xff"
# "ua" "rid" "authority" "upstream" -> 13 pieces, the odd ones quoted.
_QUOTES = 12
_START = re.compile(r"^\[(?P<start>[^\[\]]{1,64})\] $")
_MIDDLE = re.compile(r"^ (?P<code>\d{1,3}) (?P<flags>\S+) (?P<rx>\S+) (?P<tx>\S+) (?P<duration>\S+) (?P<ust>\S+) $")
_UPSTREAM = re.compile(r"^[^\s\"]{1,300}$")


def _start(value: Any) -> float:
    from contract.normalize import RecordError, parse_ts

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
    check_length(line)
    text = line.strip()
    parts = text.split('"')
    start = _START.match(parts[0])
    if start is None or len(parts) < 3:
        raise ParseError("bad_format", "not Envoy's default text access-log format", fmt=NAME)
    if len(parts) != _QUOTES + 1:
        raise ParseError("field_count", f"{len(parts) - 1} quotes where Envoy's default format writes {_QUOTES}: a "
                         "quote inside a header a client sends (User-Agent, X-Forwarded-For, X-Request-Id, "
                         ":authority, the path) could choose the node, so the line is not read; configure "
                         "Envoy's JSON access log (json_format), which escapes them", fmt=NAME)
    middle = _MIDDLE.match(parts[2])
    if middle is None or parts[4] != " " or parts[6] != " " or parts[8] != " " or parts[10] != " " or parts[12]:
        raise ParseError("bad_format", "Envoy's default text format has six quoted fields in this order: "
                         '"request" code flags rx tx duration upstream-time "xff" "ua" "rid" "authority" "upstream"',
                         fmt=NAME)
    upstream = parts[11]
    if upstream != "-" and _UPSTREAM.match(upstream) is None:
        raise ParseError("bad_upstream_host", f"%UPSTREAM_HOST% {upstream[:40]!r}", fmt=NAME)
    node = _node(upstream, node_map)
    g = middle.groupdict()
    if not g["duration"].isdigit() or len(g["duration"]) > 10:
        raise ParseError("no_latency", f"%DURATION% is {g['duration'][:20]!r}", fmt=NAME)
    total_ms = float(g["duration"])
    rid = parts[7]
    return {
        "ts": _start(start["start"]) + total_ms / 1000.0,
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
    check_length(line)
    if line.lstrip().startswith("["):
        return parse_text(line, node_map=node_map)
    return parse_object(load_object(line, reason="bad_json", what="an Envoy JSON access-log line", fmt=NAME),
                        node_map=node_map)
