"""Gateway access-log parsers, one module per format.

Contract of every format module: ``parse_line(line: str, *, node_map: NodeMap) -> dict`` returns one
record in the ingest record format (see :mod:`outlier_admin.ingest.records`; ``ts`` may be epoch
seconds or RFC 3339, ``node`` is the upstream address as logged or as mapped by ``node_map``) or
raises :class:`ParseError` with a short reason code. Lines that are valid log lines but carry no
sample (no upstream chosen, a health check) also raise ``ParseError`` (reason ``no_upstream`` ...),
so the tailer keeps them as rejected input with the reason instead of dropping them silently.

``node_map`` maps an upstream address as it appears in the log (``10.0.0.5:8000``) to the node name
or address to put in the record; addresses not in it pass through unchanged (the pipeline resolves
addresses to nodes). Register a new format by adding one line to :data:`FORMATS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson


class ParseError(ValueError):
    """A line or record that cannot become a sample. ``reason`` is a short code (``bad_json``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


NodeMap = Mapping[str, str]
Parser = Callable[..., dict[str, Any]]


def map_node(address: str, node_map: NodeMap | None) -> str:
    """The node for an upstream address: ``node_map[address]`` or the address itself."""
    if node_map:
        return node_map.get(address, address)
    return address


def load_object(line: str, *, reason: str, what: str) -> dict[str, Any]:
    """The JSON object on ``line``; ``bad_json`` when it is not JSON, ``reason`` when not an object."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ParseError("bad_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise ParseError(reason, f"{what} must be an object")
    return obj


# Imported after ParseError/map_node are defined: the format modules import them from here.
from outlier_admin.ingest.logformats import envoy, haproxy, jsonl, nginx  # noqa: E402

FORMATS: dict[str, Parser] = {
    "envoy": envoy.parse_line,
    "haproxy": haproxy.parse_line,
    "nginx": nginx.parse_line,
    "jsonl": jsonl.parse_line,
}


def get_parser(name: str) -> Parser:
    """The ``parse_line`` of format ``name``; ``KeyError`` lists the known formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown log format {name!r}; known: {sorted(FORMATS)}") from None
