"""Envoy JSON access logs, including Envoy AI Gateway's token fields.

One JSON object per line (``json_format`` access log). Fields read (first present alias wins):

- upstream node: ``upstream_host`` (``%UPSTREAM_HOST%``) | ``upstream_address``;
- end time: ``start_time`` (RFC 3339) + ``duration`` ms (``%DURATION%``, total request time);
- ``total_ms``: ``duration``; ``ttft_ms``: ``response_duration`` / ``ttft_ms`` when logged
  (``%RESPONSE_DURATION%`` is the time to the first response byte = first token when streaming);
- tokens: ``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens`` (Envoy AI Gateway),
  or ``prompt_tokens`` / ``completion_tokens`` / ``input_tokens`` / ``output_tokens``;
- ``status``: ``response_code`` (Envoy logs 0 when no response was sent: a timeout/reset);
- ``request_id``: ``x-request-id``; ``group``: ``group`` when the log carries one.

Lines without an upstream (``null`` / ``-``: no route, local reply) raise ``no_upstream``; lines
without token counts (an MCP call, a non-LLM route) raise ``no_token_counts``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from outlier_admin.ingest.logformats import NodeMap, ParseError, load_object, map_node

_PROMPT = ("gen_ai.usage.input_tokens", "prompt_tokens", "input_tokens")
_COMPLETION = ("gen_ai.usage.output_tokens", "completion_tokens", "output_tokens")
_TTFT = ("response_duration", "ttft_ms")


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = obj.get(key)
        if value is not None and value != "-":
            return value
    return None


def _num(value: Any, field: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ParseError(f"bad_{field}", f"{field} {value!r} is not a number") from None


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One Envoy JSON access-log line -> ingest record (see module docstring)."""
    obj = load_object(line, reason="bad_json", what="an Envoy JSON access-log line")
    upstream = _first(obj, ("upstream_host", "upstream_address"))
    if not upstream:
        raise ParseError("no_upstream", "no upstream_host: the request did not reach a node")
    prompt, completion = _first(obj, _PROMPT), _first(obj, _COMPLETION)
    if prompt is None or completion is None:
        raise ParseError("no_token_counts", "no gen_ai.usage.input_tokens/output_tokens in the line")
    duration = _first(obj, ("duration", "duration_ms"))
    if duration is None:
        raise ParseError("missing_duration", "no duration (%DURATION%) in the line")
    total_ms = _num(duration, "duration")
    start = obj.get("start_time")
    if not isinstance(start, str):
        raise ParseError("missing_start_time", "no start_time (%START_TIME%) in the line")
    try:
        started = datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ParseError("bad_start_time", f"start_time {start!r} is not RFC 3339") from None
    ttft = _first(obj, _TTFT)
    status = obj.get("response_code", 200)
    try:
        status = int(status)
    except (TypeError, ValueError):
        raise ParseError("bad_status", f"response_code {status!r} is not an integer") from None
    return {
        "ts": started + total_ms / 1000.0,
        "node": map_node(str(upstream), node_map),
        "group": obj.get("group"),
        "prompt_tokens": _num(prompt, "prompt_tokens"),
        "completion_tokens": _num(completion, "completion_tokens"),
        "ttft_ms": None if ttft is None else _num(ttft, "ttft_ms"),
        "total_ms": total_ms,
        "status": status,
        "request_id": obj.get("x-request-id"),
    }
