"""Gateway access-log parsers, one module per format.

Contract of every format module: ``parse_line(line: str, *, node_map: NodeMap) -> dict`` returns one
record in the ingest record format (see :mod:`contract.normalize`; ``ts`` may be epoch
seconds or RFC 3339, ``node`` is the upstream address as logged or as mapped by ``node_map``) or
raises :class:`ParseError` with a short reason code. Lines that are valid log lines but carry no
sample (no upstream chosen, a health check) also raise ``ParseError`` (reason ``no_upstream`` ...),
so the tailer keeps them as rejected input with the reason instead of dropping them silently.

``node_map`` maps an upstream address as it appears in the log (``127.0.0.5:8000``, or HAProxy's
``backend/server``) to the node name or address to put in the record; addresses not in it pass
through unchanged (the pipeline resolves addresses to nodes). Its key ``*`` names the node of lines
that name no upstream at all (an nginx in front of one node that logs no ``$upstream_addr``).
Register a new format by adding a line to :data:`FORMATS` and its label to :data:`LABELS`.

Formats read with no custom configuration: nginx ``combined`` (optionally with ``$request_time``,
``$upstream_addr``, ``$upstream_response_time`` appended) and ingress-nginx's upstream format;
Envoy's default text format and JSON access logs (Envoy AI Gateway's token fields); HAProxy's
default ``option httplog``; LiteLLM's ``StandardLoggingPayload``; OpenAI-style JSON with a nested
``usage``; our own JSONL. ``auto`` recognises each line's format (:mod:`.auto`).

**Untrusted text.** A client writes parts of every line (the request, headers, a Basic-auth user
name), so no parser searches a line with a pattern that can backtrack: each is anchored on what the
gateway itself writes and linear in the line, and a line over :data:`MAX_LINE_BYTES` is refused
``line_too_long`` before any pattern reads it (the tailer and the shipper skip it in the file
unread). Fields a client controls never decide the node: a line whose quotes are not where its
format puts them is refused ``field_count`` (Envoy's text format does not escape quotes in headers;
nginx does, as ``\\x22``), a JSON line naming a key twice ``duplicate_key``, an nginx suffix giving a
field twice ``ambiguous_fields``. Each module's docstring says which fields its format's clients write.

Every refusal names the format the line looks like (``ParseError.fmt``; :data:`LABELS` for humans):
a parser given a line of another known format refuses it as ``wrong_format`` naming that format,
not as ``bad_format``, so an operator who picked the wrong ``--format`` is told which one to pick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contract.logformats import jsondecode  # orjson when installed, else the standard library
from contract.normalize import ParseError

# A line longer than this is refused before any pattern reads it (reason LINE_TOO_LONG). The one
# owner of the rule: the tailer and the shipper import it to skip such a line in the file without
# reading it into memory whole. Why 1 MiB: the gateways bound their own lines far below it (HAProxy
# truncates a log line at its `log ... len`, at most 64 KiB; nginx refuses request headers over
# large_client_header_buffers, 4 x 8 KiB by default, so a combined line holds a few tens of KiB of
# client text; Envoy's max_request_headers_kb defaults to 60 KiB), and a LiteLLM payload reaches it
# only by logging the messages of a prompt of some 250,000 tokens (LiteLLM's turn_off_message_logging
# keeps them out). Every parser is linear in its input, so the cap bounds the work of one line (a few
# milliseconds at 1 MiB) and it stays far below the tailer's read (tailer.MAX_BYTES, 8 MiB), so a
# line under the cap always fits one read.
MAX_LINE_BYTES = 1 << 20
LINE_TOO_LONG = "line_too_long"


def too_long_error(size: int | str) -> ParseError:
    """The refusal of a line of ``size`` bytes (``"at least N"`` when only a bound is known). It
    names no format (``fmt`` ""): the line was not read."""
    return ParseError(LINE_TOO_LONG, f"a line of {size} bytes, over the {MAX_LINE_BYTES}-byte limit of a log line "
                      "(logformats.MAX_LINE_BYTES): skipped unread")


def check_length(line: str) -> None:
    """Raise ``line_too_long`` when ``line`` is over :data:`MAX_LINE_BYTES` in UTF-8. Every parser
    calls it first, so no regular expression ever reads more than the cap. Counting the encoded
    bytes only when the characters alone cannot decide (a character is 1 to 4 bytes) keeps the
    common case at one ``len``."""
    n = len(line)
    if n > MAX_LINE_BYTES:
        raise too_long_error(f"at least {n}")
    if n * 4 > MAX_LINE_BYTES and not line.isascii():
        size = len(line.encode("utf-8", "surrogatepass"))
        if size > MAX_LINE_BYTES:
            raise too_long_error(size)


NodeMap = Mapping[str, str]
Parser = Callable[..., dict[str, Any]]


def map_node(address: str, node_map: NodeMap | None) -> str:
    """The node for an upstream address: ``node_map[address]`` or the address itself."""
    if node_map:
        return node_map.get(address, address)
    return address


def default_node(node_map: NodeMap | None) -> str | None:
    """The node of lines that name no upstream (``node_map["*"]``), if the source has one."""
    return node_map.get("*") if node_map else None


MAX_NODE_MAP = 10_000


def parse_node_map(text: str) -> dict[str, str]:
    """An operator's node map: ``"K=NODE,K=NODE"`` or a JSON object -> ``{K: NODE}``. ``K`` is what a
    line names (HAProxy's ``backend/server``, an upstream address) or ``*``; every ``NODE`` must be a
    valid node id (:func:`contract.names.validate_node_id`); at most :data:`MAX_NODE_MAP`
    entries. Raises ``ValueError`` naming the bad entry."""
    from contract.names import NameError_, validate_node_id

    text = text.strip()
    if text.startswith("{"):
        try:
            raw = jsondecode.loads(text)
        except jsondecode.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("a JSON node map must be an object")
        pairs: list[tuple[Any, Any]] = list(raw.items())
    else:
        pairs = [tuple(item.split("=", 1)) if "=" in item else (item, "") for item in text.split(",") if item.strip()]
    if len(pairs) > MAX_NODE_MAP:
        raise ValueError(f"{len(pairs)} entries, at most {MAX_NODE_MAP}")
    out: dict[str, str] = {}
    for key, value in pairs:
        if not isinstance(key, str) or not key.strip() or len(key) > 300 or not isinstance(value, str):
            raise ValueError(f"bad entry {str(key)[:40]!r}: write KEY=NODE")
        try:
            out[key.strip()] = validate_node_id(value.strip())
        except NameError_ as exc:
            raise ValueError(f"{key.strip()!r}: {exc.detail}") from None
    return out


def decode_json(line: str, *, what: str, fmt: str = "") -> Any:
    """The JSON value on ``line`` (at most :data:`MAX_LINE_BYTES`); ``duplicate_key`` when an object
    names a key twice (:func:`.jsondecode.loads_unique`: which of the two is the gateway's cannot be
    told), ``bad_json`` when it is not JSON."""
    check_length(line)
    try:
        return jsondecode.loads_unique(line)
    except jsondecode.DuplicateKeyError as exc:
        raise ParseError("duplicate_key", f"{what}: {exc.msg}", fmt=fmt) from None
    except jsondecode.JSONDecodeError as exc:
        raise ParseError("bad_json", f"{what}: {exc}", fmt=fmt) from None


def load_object(line: str, *, reason: str, what: str, fmt: str = "") -> dict[str, Any]:
    """The JSON object on ``line`` (:func:`decode_json`); ``reason`` when it is not an object."""
    obj = decode_json(line, what=what, fmt=fmt)
    if not isinstance(obj, dict):
        raise ParseError(reason, f"{what} must be an object", fmt=fmt)
    return obj


# Imported after ParseError/map_node are defined: the format modules import them from here.
from contract.logformats import envoy, haproxy, jsonl, litellm, nginx, openai  # noqa: E402

LABELS: dict[str, str] = {
    "nginx": "nginx (combined / ingress-nginx)",
    "envoy": "Envoy access log (default text format or JSON)",
    "haproxy": "HAProxy httplog",
    "litellm": "LiteLLM StandardLoggingPayload",
    "openai": openai.LABEL,
    "jsonl": "outlier-admin JSONL records",
}
_PARSERS: dict[str, Parser] = {
    "envoy": envoy.parse_line,
    "haproxy": haproxy.parse_line,
    "nginx": nginx.parse_line,
    "litellm": litellm.parse_line,
    "openai": openai.parse_line,
    "jsonl": jsonl.parse_line,
}
# Refusals that say "this is not a line of my format": filed under no format unless one is recognised.
_NOT_MINE = frozenset({"bad_format", "bad_json", "not_an_object"})


def _named(name: str, parse: Parser) -> Parser:
    """``parse`` whose refusals name the format the line looks like (see module docstring)."""

    def parse_named(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
        if isinstance(line, str):
            check_length(line)  # before any pattern, the sniffing below included
        try:
            rec = parse(line, node_map=node_map)
        except ParseError as exc:
            # Any refusal, not only "not my format": a LiteLLM payload read as Envoy JSON decodes fine
            # and would be refused "no_upstream", which sends the operator looking in the wrong place.
            other = auto.sniff(line) if isinstance(line, str) else None
            if other is not None and other != name:
                raise ParseError("wrong_format", f"this line looks like {LABELS[other]}, but the source "
                                 f"reads {LABELS[name]} (use --format {other} or auto)", fmt=other) from None
            exc.fmt = (other or "") if exc.reason in _NOT_MINE else (exc.fmt or name)
            raise
        rec["_format"] = name  # what the pipeline files the record's refusal under, if it is refused
        return rec

    parse_named.__doc__ = parse.__doc__
    return parse_named


from contract.logformats import auto  # noqa: E402  (needs _PARSERS and LABELS)

FORMATS: dict[str, Parser] = {name: _named(name, parse) for name, parse in _PARSERS.items()}
FORMATS["auto"] = auto.parse_line
LABELS["auto"] = "auto (recognised per line)"


def get_parser(name: str) -> Parser:
    """The ``parse_line`` of format ``name``; ``KeyError`` lists the known formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown log format {name!r}; known: {sorted(FORMATS)}") from None
