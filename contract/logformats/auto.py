"""``--format auto``: recognise each line's format, then parse it with that format's parser.

Recognition is by shape, cheapest test first, and never guesses between two formats:

- a JSON object (``{`` first): LiteLLM's ``StandardLoggingPayload`` (``startTime`` and ``endTime``,
  or a ``standard_logging_object`` wrapper), Envoy JSON (``start_time`` with ``upstream_host`` /
  ``duration`` / ``response_code``), OpenAI-style JSON (a nested ``usage`` object, or a node and a
  latency field), our JSONL (``node`` and ``total_ms``);
- ``[2016-04-15T20:17:00.310Z] "...``: Envoy's default text format;
- ``127.0.0.1:33317 [06/Feb/2009:12:14:14.655] ...`` after any syslog prefix: HAProxy ``httplog``
  (or ``tcplog``, refused with its reason);
- ``127.0.0.1 - - [03/Dec/2026:07:35:32 +0000] "...``: nginx (``combined`` and its extensions).

Per line, not per file: a log that mixes formats (a switch of ``log_format`` mid-file) is read
whole. A line of no known shape is refused as ``unrecognized_format``; a line of a known shape that
its parser refuses keeps that parser's reason and names the format (``ParseError.fmt``).
"""

from __future__ import annotations

import re
from typing import Any

from contract.logformats import (
    _PARSERS,
    LABELS,
    MAX_LINE_BYTES,
    NodeMap,
    ParseError,
    check_length,
    decode_json,
    envoy,
    haproxy,
    jsondecode,
    jsonl,
    litellm,
    nginx,
    openai,
)

# Every test is anchored or of fixed length: sniffing runs on every refused line of every format,
# so it must cost a constant per character (it is reached with lines of up to MAX_LINE_BYTES).
_ENVOY_TEXT = re.compile(r'^\[\d{4}-\d{2}-\d{2}T[^\[\]]{1,40}\] "')
_HAPROXY_TAG = re.compile(r"haproxy\[\d{1,10}\]: ")


def json_format(obj: dict[str, Any]) -> str | None:
    """The JSON format an object looks like (see module docstring), or None."""
    if litellm.is_payload(obj):
        return "litellm"
    if "start_time" in obj and any(k in obj for k in ("upstream_host", "duration", "response_code")):
        return "envoy"
    if isinstance(obj.get("usage"), dict) or isinstance(openai.dig(obj, "response.usage"), dict):
        return "openai"
    if "node" in obj and "total_ms" in obj:
        return "jsonl"
    if openai.first(obj, openai.NODE_KEYS) is not None and (
        openai.first(obj, openai.MS_KEYS) is not None or openai.first(obj, openai.S_KEYS) is not None
    ):
        return "openai"
    return None


def sniff(line: str) -> str | None:
    """The key in ``FORMATS`` of the format ``line`` looks like, or None."""
    if len(line) > MAX_LINE_BYTES:
        return None  # not read: refused line_too_long by every parser
    text = line.strip()
    if not text:
        return None
    if text[0] == "{":
        try:
            obj = jsondecode.loads(text)
        except jsondecode.JSONDecodeError:
            return None
        return json_format(obj) if isinstance(obj, dict) else None
    if _ENVOY_TEXT.match(text):
        return "envoy"
    if nginx.looks_like(text):
        return "nginx"
    if _HAPROXY_TAG.search(text) or haproxy.looks_like(text):
        return "haproxy"
    return None


_OBJECT_PARSERS = {"litellm": litellm.parse_object, "envoy": envoy.parse_object,
                   "openai": openai.parse_object, "jsonl": jsonl.parse_object}


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """Recognise ``line``'s format and parse it (see module docstring)."""
    if not isinstance(line, str):
        raise ParseError("unrecognized_format", "line is not text")
    check_length(line)
    text = line.strip()
    if text.startswith("{"):
        obj = decode_json(text, what="a JSON line")
        fmt = json_format(obj) if isinstance(obj, dict) else None
        if fmt is None:
            raise ParseError("unrecognized_format", "a JSON value with none of the fields of LiteLLM, Envoy, "
                             "OpenAI-style or outlier-admin JSONL records")
        return _tagged(fmt, _OBJECT_PARSERS[fmt], obj, node_map)
    fmt = sniff(text)
    if fmt is None:
        raise ParseError("unrecognized_format", "not a line of any known format: " + "; ".join(
            label for key, label in LABELS.items() if key != "auto"))
    return _tagged(fmt, _PARSERS[fmt], line, node_map)


def _tagged(fmt: str, parse: Any, arg: Any, node_map: NodeMap | None) -> dict[str, Any]:
    try:
        rec = parse(arg, node_map=node_map)
    except ParseError as exc:
        exc.fmt = exc.fmt or fmt
        raise
    rec["_format"] = fmt
    return rec

