"""Caddy integration through its admin API (Caddy 2.x, ``reverse_proxy``).

The operator gives the ``reverse_proxy`` handler of the group an ``@id`` (``docs/gateways.md``,
Caddy), so the admin API addresses it as ``/id/<id>`` wherever it sits in the config
(https://caddyserver.com/docs/api#using-id-in-json)::

    {"@id": "outlier-llm", "handler": "reverse_proxy",
     "upstreams": [{"dial": "10.0.0.7:8000"}, {"dial": "10.0.0.8:8000"}, ...],
     "load_balancing": {"selection_policy": {"policy": "weighted_round_robin", "weights": [1, 1, ...]}}}

The upstreams it lists are the backends Caddy knows (matched to nodes by their ``dial``
``host:port``); the agent never adds one. Per apply it reads the handler (``GET /id/<id>``, with its
``ETag``), computes the new handler and, when it differs, writes it back in one ``PATCH /id/<id>``
with ``If-Match`` (a config changed in between answers 412 and the apply is redone on the fresh one).
Caddy applies it by a graceful config reload, in milliseconds (docs/gateways.md).

* ``weighted_round_robin`` (Caddy >= 2.8; weight 0 skips an upstream in 2.11): the weights are set,
  aligned with ``upstreams``; a quarantined node gets 0. Caddy's implementation serves an upstream
  its weight in **consecutive** requests (not interleaved), so the document's ``0..base`` weight is
  mapped onto ``0..full_weight`` (default 10; a soft-degraded node never rounds down to 0) and the
  weights are divided by their greatest common divisor: all at base weight is ``1, 1, 1, 1`` (plain
  round robin), one node at 35 % is ``5, 5, 5, 2``. The share is exact to 1/``full_weight``; the
  bursts are at most ``full_weight`` requests long.
* any other policy (``least_conn``, ``round_robin``, ``random``...): Caddy has no per-upstream
  weight there, so a degraded node keeps its full share (the result's ``note`` says so once) and a
  quarantined node's upstream is taken out of ``upstreams`` and put back when it is restored. The
  agent remembers the upstreams it took out in memory only: if the agent restarts while one is out,
  that node is ``missing`` until Caddy's config is loaded again (``caddy reload``).
* a document node with no upstream is skipped and reported (``missing``); an upstream matching no
  node is left as it is (``unknown``); a change that would leave no upstream to route to is refused.

Caddy down or refusing: the admin API client retries with backoff (``AdminAPI``), then the apply
fails (counted, retried by the agent); the running config is untouched until a write succeeds.
"""

from __future__ import annotations

import copy
import math
import urllib.parse
from typing import Any

from agent.adminapi import AdminAPI, AdminAPIRefused
from agent.base import ApplyError, ApplyResult, NoteOnce, refuse_no_backend
from agent.client import EffectiveWeights
from contract.weights_document import split_address

WEIGHTED = "weighted_round_robin"
DEFAULT_FULL_WEIGHT = 10
MAX_FULL_WEIGHT = 100


def caddy_weight(weight: int, base_weight: int, full_weight: int = DEFAULT_FULL_WEIGHT) -> int:
    """``0..base_weight`` onto ``0..full_weight``: 0 stays 0, anything else is at least 1."""
    if weight <= 0:
        return 0
    return min(full_weight, max(1, round(weight * full_weight / base_weight)))


def reduce_weights(weights: list[int]) -> list[int]:
    """Divided by their greatest common divisor (zeros stay): the shortest bursts for the same shares."""
    g = math.gcd(*[w for w in weights if w > 0]) if any(w > 0 for w in weights) else 1
    return [w // g for w in weights]


def upstream_address(upstream: dict[str, Any]) -> str:
    """``host:port`` of an upstream's ``dial`` (a ``tcp/`` network prefix dropped)."""
    dial = str(upstream.get("dial", ""))
    if "/" in dial:
        dial = dial.split("/", 1)[1]
    host, port = split_address(dial)  # ValueError for a placeholder or a unix socket
    return f"{host}:{port}"


def policy_of(handler: dict[str, Any]) -> str:
    return str(((handler.get("load_balancing") or {}).get("selection_policy") or {}).get("policy", "random"))


def plan_handler(handler: dict[str, Any], weights: EffectiveWeights, parked: dict[str, dict[str, Any]],
                 full_weight: int = DEFAULT_FULL_WEIGHT) -> tuple[dict[str, Any], ApplyResult, dict[str, dict[str, Any]]]:
    """The ``reverse_proxy`` handler with ``weights`` applied (pure; module docstring).

    ``parked``: upstreams taken out earlier (non-weighted policies), by address. Returns
    ``(new_handler, result, parked_after)``."""
    if handler.get("handler") != "reverse_proxy":
        raise ApplyError(f"the handler is {handler.get('handler')!r}, not reverse_proxy")
    new = copy.deepcopy(handler)
    upstreams = new.get("upstreams")
    if not isinstance(upstreams, list):
        raise ApplyError("the reverse_proxy handler has no static upstreams list (dynamic upstreams are not driven)")
    addrs: list[str | None] = []
    for up in upstreams:
        try:
            addrs.append(upstream_address(up))
        except ValueError:
            addrs.append(None)  # a placeholder or a socket: no node can match it; left alone
    policy = policy_of(new)
    result = ApplyResult()
    by_node = {}
    for node in weights.nodes:
        host, port = split_address(node.address)
        by_node[f"{host}:{port}"] = node
    known = {a for a in addrs if a} | set(parked)
    result.missing = [f"{n.node} ({n.address})" for k, n in by_node.items() if k not in known]
    result.unknown = sorted((k for k in known if k not in by_node), key=str)
    parked_after = dict(parked)
    if policy == WEIGHTED:
        # Parked upstreams (the policy was changed under us) come back first, as plain upstreams.
        for key, up in parked.items():
            upstreams.append(up)
            addrs.append(key)
        parked_after = {}
        sel = new["load_balancing"]["selection_policy"]
        current = [int(w) for w in sel.get("weights") or []]
        current += [1] * (len(upstreams) - len(current))
        wanted: list[int] = []
        for i, key in enumerate(addrs):
            node = by_node.get(key) if key else None
            if node is None:
                # Unknown: kept at a full node's share (or off, if someone set it to 0).
                wanted.append(0 if current[i] == 0 else full_weight)
            else:
                wanted.append(0 if node.quarantined else caddy_weight(node.weight, node.base_weight, full_weight))
        wanted = reduce_weights(wanted)
        refuse_no_backend(sum(1 for w in wanted if w > 0), "Caddy", f" ({len(upstreams)} upstreams)")
        if wanted != current[:len(upstreams)] or parked:
            result.changes.append(f"weights {wanted} (was {current[:len(upstreams)]}) for "
                                  f"{[a or '?' for a in addrs]}")
        sel["weights"] = wanted
        return new, result, parked_after
    kept: list[dict[str, Any]] = []
    for up, key in zip(upstreams, addrs, strict=True):
        node = by_node.get(key) if key else None
        if node is not None and node.quarantined:
            parked_after[key] = up  # type: ignore[index]
            result.changes.append(f"{key} quarantined: taken out of upstreams")
        else:
            kept.append(up)
    for key, up in parked.items():
        node = by_node.get(key)
        if node is None or not node.quarantined:
            kept.append(up)
            del parked_after[key]
            result.changes.append(f"{key} restored to upstreams")
    refuse_no_backend(len(kept), "Caddy", f" ({len(known)} upstreams known)")
    new["upstreams"] = kept
    degraded = sorted(n.node for n in weights.nodes if not n.quarantined and n.weight < n.base_weight)
    if degraded:
        result.note = (f"Caddy policy {policy!r} has no weights: degraded nodes {', '.join(degraded)} keep "
                       f"their full share (use {WEIGHTED})")
    return new, result, parked_after


class CaddyApplier:
    """Drives one ``reverse_proxy`` handler through Caddy's admin API (module docstring)."""

    name = "caddy"

    def __init__(self, admin_url: str, handler_id: str, *, full_weight: int = DEFAULT_FULL_WEIGHT,
                 timeout_s: float = 2.0) -> None:
        if not 1 <= full_weight <= MAX_FULL_WEIGHT:
            raise ValueError(f"full_weight must be in 1..{MAX_FULL_WEIGHT}")
        if not handler_id or any(c in handler_id for c in "/?#%"):
            raise ValueError(f"not a Caddy @id: {handler_id!r}")
        self.api = AdminAPI(admin_url, what="Caddy admin API", timeout_s=timeout_s)
        self.handler_id = handler_id
        self.path = f"/id/{urllib.parse.quote(handler_id, safe='')}"
        self.full_weight = full_weight
        self.parked: dict[str, dict[str, Any]] = {}
        self._note = NoteOnce()

    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        for _ in range(3):  # a config changed between our read and our write: read again
            try:
                resp = self.api.request("GET", self.path)
            except AdminAPIRefused as exc:
                if exc.status in (400, 404):
                    raise ApplyError(f"Caddy has no config object with @id {self.handler_id!r}: set "
                                     '"@id" on the reverse_proxy handler (docs/gateways.md, Caddy)') from exc
                raise
            handler = resp.body
            if not isinstance(handler, dict):
                raise ApplyError(f"Caddy has no object at {self.path} (is '@id' set on the reverse_proxy handler?)")
            new, result, parked = plan_handler(handler, weights, self.parked, self.full_weight)
            if new != handler:
                etag = resp.headers.get("etag")
                try:
                    self.api.request("PATCH", self.path, new, headers={"If-Match": etag} if etag else None)
                except AdminAPIRefused as exc:
                    if exc.status == 412:
                        continue
                    raise
            self.parked = parked
            return self._note(result)
        raise ApplyError(f"Caddy's config at {self.path} kept changing under the agent (412 three times)")

    def set_safeguard(self, active: bool) -> None:
        # Caddy has no runtime variable for it; the flag is in the agent's metrics and status file.
        return None
