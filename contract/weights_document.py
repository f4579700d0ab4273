"""The weights document: what the control plane publishes per group and every gateway applies.

One type, :class:`WeightsDocument`, with its one JSON form (:meth:`~WeightsDocument.to_json`,
:meth:`~WeightsDocument.from_json`), used by the writers (the tick and ``control.publish``) and by
every reader (the gateway client and the agents, the metrics and alerts of the control plane, the
tick continuing a version). Plain Python, standard library only (``orjson`` when installed): the
gateway agent's distribution ships this module with redis-py only. The JSON::

    {"group": "llama-70b", "version": 42, "generated_at": 1733212345.2, "stale_after_s": 30,
     "safeguard": false,
     "nodes": [{"node": "gpu-07", "address": "127.0.0.7:8000", "weight": 35, "state": "degraded",
                "base_weight": 100}, ...]}

- ``version`` increases by one at every publish (every tick, even when no weight changed: a
  heartbeat); ``generated_at`` is the control plane's clock (epoch seconds).
- ``weight`` is an integer on the node's ``0..base_weight`` scale: a share of its base weight. An
  operator's pin is on that scale too (:func:`pin_range`: at most the base weight; to send a node
  more traffic than its peers, raise its base weight). Out-of-service states (the traffic table,
  :data:`contract.traffic.TRAFFIC`) carry weight 0; gateways that cannot express 0 drain by ``state``.
- A gateway ignores a document older than ``stale_after_s`` and serves every node at its
  ``base_weight`` (fail open). The defaults, stated once: :data:`DEFAULT_BASE_WEIGHT` and
  :data:`DEFAULT_STALE_AFTER_S` (the control plane's ``WEIGHTS_STALE_AFTER_S`` default, and what a
  reader assumes of a document that omits the field).

A document is refused whole when its own fields are wrong; one malformed *node* (an address that is
not ``host:port``, a weight out of range, a duplicate) is left out with its reason in ``skipped``,
and the rest of the group is applied. The publisher builds its document through the same parse
(:meth:`WeightsDocument.build`), so it never publishes a node a gateway would refuse.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from contract.names import NameError_, parse_address  # plain Python, like detector.states
from contract.traffic import DEFAULT_BASE_WEIGHT, Traffic, traffic_of

try:  # the agent's optional fast path; the control plane always has it
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - the agent without its orjson extra
    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

#: The largest base weight a node may be registered with.
MAX_BASE_WEIGHT = 1_000_000
#: Seconds after ``generated_at`` past which a gateway fails open (``WEIGHTS_STALE_AFTER_S``).
DEFAULT_STALE_AFTER_S = 30


def pin_range(base_weight: int) -> tuple[int, int]:
    """The weights an operator may pin a node of ``base_weight`` to: the document's scale, ``0`` to
    the base weight (a gateway refuses a weight above it, which would drop the node)."""
    return 0, max(int(base_weight), 1)


class DocumentError(ValueError):
    """A weights document that cannot be used; ``str(err)`` is the reason."""


@functools.lru_cache(maxsize=65536)  # the same addresses arrive in every document (every tick)
def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.7:8000"`` -> ``("127.0.0.7", 8000)``; ``"[::1]:8000"`` -> ``("::1", 8000)``.

    The rule is the control plane's (:func:`contract.names.parse_address`: an IP or a DNS
    name, a port in 1..65535), without a scheme: the host ends up in a gateway's configuration
    (an nginx ``server`` line), so nothing else may pass. Raises DocumentError with the reason.
    """
    if not isinstance(address, str) or ":" not in address or "://" in address:
        raise DocumentError(f"address {address!r} is not host:port")
    try:
        parsed = parse_address(address)
    except NameError_ as exc:
        raise DocumentError(f"address {address!r} is not host:port: {exc.detail}") from None
    return parsed.host, parsed.port


@dataclass(frozen=True)
class NodeWeight:
    """One node of a group as a gateway sees it."""

    node: str
    address: str  # "host:port" (IPv6 as "[::1]:8000")
    weight: int  # 0..base_weight
    state: str
    base_weight: int

    @property
    def host(self) -> str:
        return split_address(self.address)[0]

    @property
    def port(self) -> int:
        return split_address(self.address)[1]

    @property
    def quarantined(self) -> bool:
        """No traffic at all: weight 0 or a state the traffic table drains."""
        return self.weight <= 0 or traffic_of(self.state) is Traffic.DRAIN

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "address": self.address, "weight": self.weight, "state": self.state,
                "base_weight": self.base_weight}


@dataclass(frozen=True)
class WeightsDocument:
    """A validated weights document (see the module docstring for its JSON)."""

    group: str
    version: int
    generated_at: float
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    safeguard: bool = False
    nodes: tuple[NodeWeight, ...] = ()
    #: Nodes left out, one reason each (``nodes[3] ('gpu-9'): address ... is not host:port``).
    skipped: tuple[str, ...] = ()

    def age_s(self, now: float) -> float:
        return now - self.generated_at

    def is_stale(self, now: float) -> bool:
        return self.age_s(now) > self.stale_after_s

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "version": self.version, "generated_at": self.generated_at,
                "stale_after_s": self.stale_after_s, "safeguard": self.safeguard,
                "nodes": [n.to_dict() for n in self.nodes]}

    def to_json(self) -> bytes:
        """The document as a gateway reads it (``skipped`` nodes are not in it)."""
        return _dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str, *, expected_group: str | None = None) -> WeightsDocument:
        """Validate a JSON weights document; raise DocumentError(reason) if it cannot be used.

        Refused whole when its own fields are wrong (not JSON, no version, a group other than
        ``expected_group``, no ``nodes`` list) or when none of its nodes is valid. A node is skipped
        (its reason in ``skipped``) for a fractional, negative or above-``base_weight`` weight, an
        address that is not ``host:port``, or a node name or address already seen. Integral floats
        (``35.0``) are integers."""
        try:
            data = json.loads(raw)
        except (ValueError, TypeError) as exc:
            raise DocumentError(f"not JSON: {exc}") from None
        return cls.from_dict(data, expected_group=expected_group)

    @classmethod
    def from_dict(cls, data: Any, *, expected_group: str | None = None) -> WeightsDocument:
        """:meth:`from_json` of an already decoded document."""
        doc = _head(data, expected_group)
        nodes_raw = _require(data, "nodes", list, "document")
        kept, skipped = _parse_nodes(nodes_raw)
        if nodes_raw and not kept:
            raise DocumentError(f"no valid node in the document: {skipped[0]}")
        return doc.with_nodes(tuple(n for _, n in kept), tuple(skipped))

    @classmethod
    def build(cls, group: str, version: int, nodes: list[dict[str, Any]], *, safeguard: bool, now: float,
              stale_after_s: float) -> WeightsDocument:
        """The publisher's document from ``nodes`` laid out as the JSON's: every node judged exactly as
        a gateway will judge it, a node a gateway would refuse left out (its reason in ``skipped``).
        Raises DocumentError when the document itself is unusable (then nothing may be published)."""
        doc = cls.head(group, version, safeguard=safeguard, now=now, stale_after_s=stale_after_s)
        kept, skipped = _parse_nodes(nodes)
        return doc.with_nodes(tuple(n for _, n in kept), tuple(skipped))

    @classmethod
    def head(cls, group: str, version: int, *, safeguard: bool, now: float,
             stale_after_s: float) -> WeightsDocument:
        """A document without nodes, its own fields checked as a gateway checks them."""
        return _head({"group": group, "version": version, "generated_at": round(now, 3),
                      "stale_after_s": stale_after_s, "safeguard": safeguard}, None)

    def with_nodes(self, nodes: tuple[NodeWeight, ...], skipped: tuple[str, ...] = ()) -> WeightsDocument:
        return WeightsDocument(self.group, self.version, self.generated_at, self.stale_after_s, self.safeguard,
                               nodes, skipped)


def parse_document(raw: bytes | str, *, expected_group: str | None = None) -> WeightsDocument:
    """:meth:`WeightsDocument.from_json` (the readers' name for it)."""
    return WeightsDocument.from_json(raw, expected_group=expected_group)


def check_document(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(document without its invalid nodes, reasons)``, judged exactly as a gateway will judge it.
    Raises DocumentError when the document itself is unusable (then nothing should be published)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise DocumentError("document is not an object with a nodes list")
    _head(doc, None)
    kept, skipped = _parse_nodes(doc["nodes"])
    return {**doc, "nodes": [doc["nodes"][i] for i, _ in kept]}, skipped


def _require(obj: dict[str, Any], name: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if name not in obj:
        raise DocumentError(f"{where}: missing field {name!r}")
    value = obj[name]
    # bool is an int subclass: a JSON true must not pass as a weight or version.
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise DocumentError(f"{where}: field {name!r} has type bool")
    if not isinstance(value, kinds):
        raise DocumentError(f"{where}: field {name!r} has type {type(value).__name__}")
    return value


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(f"{where} is not a number")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise DocumentError(f"{where} {value!r} is not an integer")
    return int(value)


def _head(data: Any, expected_group: str | None) -> WeightsDocument:
    """The document's own fields (its nodes aside)."""
    if not isinstance(data, dict):
        raise DocumentError("document is not a JSON object")
    group = _require(data, "group", str, "document")
    if expected_group is not None and group != expected_group:
        raise DocumentError(f"document is for group {group!r}, expected {expected_group!r}")
    version = _as_int(_require(data, "version", (int, float), "document"), "document: version")
    generated_at = float(_require(data, "generated_at", (int, float), "document"))
    if not math.isfinite(generated_at):
        raise DocumentError("document: generated_at is not finite")
    stale = data.get("stale_after_s", DEFAULT_STALE_AFTER_S)
    if isinstance(stale, bool) or not isinstance(stale, int | float) or not stale > 0:
        raise DocumentError(f"document: stale_after_s {stale!r} is not a positive number")
    return WeightsDocument(group, version, generated_at, stale, bool(data.get("safeguard", False)))


def _parse_nodes(items: list[Any]) -> tuple[list[tuple[int, NodeWeight]], list[str]]:
    """``([(index, node), ...], [reason, ...])``: the valid nodes in order, and why each other one
    was skipped (a later duplicate of a node name or address is the one skipped)."""
    kept: list[tuple[int, NodeWeight]] = []
    skipped: list[str] = []
    seen_nodes: set[str] = set()
    seen_addr: set[tuple[str, int]] = set()
    for i, item in enumerate(items):
        try:
            node = _parse_node(item, f"nodes[{i}]")
            addr = (node.host, node.port)
            if node.node in seen_nodes or addr in seen_addr:
                raise DocumentError(f"nodes[{i}]: duplicate node {node.node!r} or address {node.address!r}")
        except DocumentError as exc:
            label = f"nodes[{i}]"
            if isinstance(item, dict) and isinstance(item.get("node"), str):
                label += f" ({item['node'][:60]!r})"
            skipped.append(f"{label}: {exc}")
            continue
        seen_nodes.add(node.node)
        seen_addr.add(addr)
        kept.append((i, node))
    return kept, skipped


def _parse_node(item: Any, where: str) -> NodeWeight:
    if not isinstance(item, dict):
        raise DocumentError(f"{where} is not an object")
    name = _require(item, "node", str, where)
    address = _require(item, "address", str, where)
    split_address(address)
    weight = _as_int(_require(item, "weight", (int, float), where), f"{where}: weight")
    if "base_weight" in item:
        base = _as_int(item["base_weight"], f"{where}: base_weight")
    else:
        # Documents without base_weight: the default scale, stretched if a node is above it.
        base = max(DEFAULT_BASE_WEIGHT, weight)
    state = item.get("state") or ("quarantined" if weight == 0 else "healthy")
    if not isinstance(state, str):
        raise DocumentError(f"{where}: state is not a string")
    if base <= 0:
        raise DocumentError(f"{where}: base_weight {base} must be positive")
    if not 0 <= weight <= base:
        raise DocumentError(f"{where}: weight {weight} outside 0..{base}")
    return NodeWeight(name, address, weight, state, base)
