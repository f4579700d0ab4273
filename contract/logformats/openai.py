"""OpenAI-style JSON access logs: one JSON object per line whose token counts sit in a nested
``usage`` object, as gateways and proxies that log the response body write them::

    {"ts": "2026-12-03T07:35:32.5Z", "upstream": "127.0.0.1:8000", "duration_ms": 812, "status": 200,
     "request_id": "r1", "usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
     "prompt_tokens_details": {"cached_tokens": 1024}}}

Fields read (first present alias wins; :data:`NODE_KEYS`, :data:`END_KEYS`, ... below):

- tokens: ``usage.prompt_tokens`` / ``usage.completion_tokens`` (Chat Completions),
  ``usage.input_tokens`` / ``usage.output_tokens`` (Responses API), also under ``response.usage``
  and at the top level; ``cached_tokens`` from ``usage.prompt_tokens_details.cached_tokens`` or
  ``usage.input_tokens_details.cached_tokens``. No counts: a latency-only record;
- node: ``upstream_host`` | ``upstream_addr`` | ``upstream_address`` | ``upstream`` | ``node`` |
  ``server`` | ``backend`` | ``api_base`` (a URL: its ``host:port``, the scheme's port when none);
- latency, milliseconds: ``total_ms`` | ``duration_ms`` | ``latency_ms`` | ``elapsed_ms`` |
  ``response_time_ms``; seconds: ``request_time`` | ``latency_s`` | ``duration_s`` |
  ``upstream_response_time`` (only keys whose unit is unambiguous are read);
- ``ts`` (the end): ``ts`` | ``end_time`` | ``timestamp`` | ``time``; or ``start_time`` plus the
  latency. Epoch seconds or RFC 3339;
- ``ttft_ms`` | ``time_to_first_token_ms``; ``status`` | ``status_code`` | ``response_code``;
  ``request_id`` | ``x-request-id`` | ``id``; ``group``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from contract.logformats import NodeMap, ParseError, load_object, map_node

NAME = "openai"
LABEL = "OpenAI-style JSON (nested usage)"

NODE_KEYS = ("upstream_host", "upstream_addr", "upstream_address", "upstream", "node", "server", "backend",
             "api_base")
MS_KEYS = ("total_ms", "duration_ms", "latency_ms", "elapsed_ms", "response_time_ms")
S_KEYS = ("request_time", "latency_s", "duration_s", "upstream_response_time")
END_KEYS = ("ts", "end_time", "timestamp", "time")
START_KEYS = ("start_time",)
TTFT_KEYS = ("ttft_ms", "time_to_first_token_ms")
STATUS_KEYS = ("status", "status_code", "response_code")
ID_KEYS = ("request_id", "x-request-id", "id")


def dig(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]`` for ``"a.b"``; None when a step is missing or not an object. A key that
    itself contains dots (Envoy AI Gateway's ``"gen_ai.usage.input_tokens"``) is tried whole first."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first value among ``keys`` (dotted paths allowed) that is present and not ``-``/empty."""
    for key in keys:
        value = dig(obj, key)
        if value is not None and value != "-" and value != "":
            return value
    return None


_PROMPT = ("usage.prompt_tokens", "usage.input_tokens", "response.usage.prompt_tokens",
           "response.usage.input_tokens", "gen_ai.usage.input_tokens", "prompt_tokens", "input_tokens")
_COMPLETION = ("usage.completion_tokens", "usage.output_tokens", "response.usage.completion_tokens",
               "response.usage.output_tokens", "gen_ai.usage.output_tokens", "completion_tokens", "output_tokens")
_CACHED = ("usage.prompt_tokens_details.cached_tokens", "usage.input_tokens_details.cached_tokens",
           "response.usage.prompt_tokens_details.cached_tokens",
           "response.usage.input_tokens_details.cached_tokens", "cached_tokens")


def tokens_of(obj: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(prompt, completion, cached)`` as found (unvalidated: :func:`records.normalize` bounds them)."""
    return first(obj, _PROMPT), first(obj, _COMPLETION), first(obj, _CACHED)


def number(value: Any, field: str, fmt: str) -> float:
    """``float(value)``; ``bad_<field>`` naming the format otherwise (bool is not a number)."""
    if isinstance(value, bool):
        raise ParseError(f"bad_{field}", f"{field} {value!r} is not a number", fmt=fmt)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ParseError(f"bad_{field}", f"{field} {str(value)[:40]!r} is not a number", fmt=fmt) from None


def address_of(value: Any) -> str | None:
    """A node key from an upstream value: ``host:port`` as is; a URL (``http://h:8000/v1``) as its
    ``host:port`` (80/443 from the scheme when it names none); ``tcp://`` stripped (Envoy's docs)."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if "://" in text:
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            return text  # refused downstream with the node-name rules' reason
        if not parts.hostname:
            return None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        if port is None:
            port = {"https": 443, "http": 80}.get(parts.scheme.lower())
        return f"{host}:{port}" if port else host
    return text


def parse_object(obj: dict[str, Any], *, node_map: NodeMap | None = None, fmt: str = NAME) -> dict[str, Any]:
    """One decoded OpenAI-style object -> ingest record (see module docstring)."""
    node = address_of(first(obj, NODE_KEYS))
    if not node:
        raise ParseError("no_upstream", f"no node field ({', '.join(NODE_KEYS)})", fmt=fmt)
    ms = first(obj, MS_KEYS)
    if ms is not None:
        total_ms = number(ms, "total_ms", fmt)
    else:
        seconds = first(obj, S_KEYS)
        if seconds is None:
            raise ParseError("no_latency", f"no latency field ({', '.join(MS_KEYS + S_KEYS)})", fmt=fmt)
        if isinstance(seconds, str) and "," in seconds:  # an nginx retry list: the last upstream's
            seconds = seconds.rsplit(",", 1)[1].strip()
        total_ms = number(seconds, "total_ms", fmt) * 1000.0
    ts = first(obj, END_KEYS)
    if ts is None:
        start = first(obj, START_KEYS)
        if start is None:
            raise ParseError("missing_ts", f"no end time ({', '.join(END_KEYS)}) nor start_time", fmt=fmt)
        from contract.normalize import RecordError, parse_ts

        try:
            ts = parse_ts(start) + total_ms / 1000.0
        except RecordError as exc:
            raise ParseError("bad_ts", exc.detail, fmt=fmt) from None
    prompt, completion, cached = tokens_of(obj)
    status = first(obj, STATUS_KEYS)
    if status is None:
        status = 200
    elif isinstance(status, str) and status.isdigit():
        status = int(status)
    ttft = first(obj, TTFT_KEYS)
    request_id = first(obj, ID_KEYS)
    return {
        "ts": ts,
        "node": map_node(node, node_map),
        "group": obj.get("group"),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
        "ttft_ms": None if ttft is None else number(ttft, "ttft_ms", fmt),
        "total_ms": total_ms,
        "status": status,
        "request_id": request_id if isinstance(request_id, str) else None,
        "_format": fmt,
    }


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One OpenAI-style JSON line -> ingest record."""
    return parse_object(load_object(line, reason="not_an_object", what=f"an {LABEL} line", fmt=NAME),
                        node_map=node_map)
