"""Our own JSONL format: one ingest record (see :mod:`contract.normalize`) per line.

Validation of the fields is the pipeline's (:func:`contract.normalize.normalize`); this
parser only decodes the line and maps the node address.
"""

from __future__ import annotations

from typing import Any

from contract.logformats import NodeMap, load_object, map_node


def parse_object(obj: dict[str, Any], *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One decoded record with its node mapped."""
    node = obj.get("node")
    if isinstance(node, str):
        obj["node"] = map_node(node, node_map)
    return obj


def parse_line(line: str, *, node_map: NodeMap | None = None) -> dict[str, Any]:
    """One JSONL line -> ingest record (a dict); ``bad_json`` / ``not_an_object`` otherwise."""
    return parse_object(load_object(line, reason="not_an_object", what="a JSONL record", fmt="jsonl"),
                        node_map=node_map)
