"""Routers driven through a worker API: the set of workers is all there is to change.

SGLang Model Gateway (:mod:`.smg`) and vLLM router (:mod:`.vllm_router`) route over a list of
workers that an HTTP API adds to and removes from at run time. Neither has a routing weight: both
accept a ``priority`` and a ``cost`` per worker and no built-in policy reads them (smg-docs
``reference/api/admin.md``, "Routing metadata"; vllm-project/router ``src/server.rs``). So the
document is expressed as membership:

* a quarantined node (weight 0 or a draining state, :attr:`NodeWeight.quarantined`) is **removed**:
  it gets no new request (smg drains it first: in-flight requests finish);
* a soft-degraded node **stays**, unless its weight is below ``remove_below`` x its base weight
  (``--router-remove-below``, default 0: never). The routers' own load-aware policies
  (``power_of_two``, ``cache_aware``) already send a slow worker fewer requests as its queue grows;
  removing a node at the first soft cut would turn every degradation into a quarantine and take
  capacity out on weak evidence, which the control plane's 30 % cap does not count;
* a node back in service (restored, probing done, or every node when the document is stale: fail
  open) is **added back**;
* the router's **last worker is never removed**: a change that would leave it none is refused
  (:func:`agent.base.refuse_no_backend`, the rule of every applier) and it keeps its workers.

Which workers may be added is the operator's say, never the document's: the worker URLs given to
the agent (``--router-workers``, the same list the router is started with), the workers the router
had when the agent first saw it, and those the agent removed itself. A document node with an
address outside that set is skipped and reported (``missing``, the ``outlier_agent_missing_nodes``
gauge): a value that arrived in data must not become a URL the router sends traffic to. Workers of
the router that no node names are left alone (``unknown``).

Calls are bounded: each has a timeout (2 s), a refused or unreachable call is retried twice with
backoff (0.2 s, then 0.4 s) and every failed attempt is counted
(``outlier_agent_apply_failures_total{gateway}``); an apply that still fails raises
:class:`ApplyError` with the router unchanged by it, and the agent tries again with backoff
(1 s doubling to 10 s, :mod:`agent.core`).
Adds go before removes, so a failure half-way never leaves the router with fewer workers than
before.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.adminapi import AdminAPI, AdminAPIRefused
from agent.base import ApplyResult, refuse_no_backend
from agent.client import EffectiveWeights, NodeWeight

log = logging.getLogger("agent.worker_set")

#: Seconds each call to the router may take; attempts per call; the first backoff (doubled after).
CALL_TIMEOUT_S = 2.0
CALL_ATTEMPTS = 3
BACKOFF_S = 0.2


def worker_address(url: str) -> str:
    """A worker URL's ``host:port`` as the weights document writes it (``http://10.0.0.7:8000/`` ->
    ``10.0.0.7:8000``; the scheme's default port when the URL has none)."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if not parsed.hostname:
        raise ValueError(f"worker URL {url!r} has no host")
    port = parsed.port or (443 if parsed.scheme in ("https", "grpcs") else 80)
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{port}"


def check_router_url(url: str) -> str:
    """The router's base URL as the operator gave it: ``http(s)://host[:port]``, no path."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path.strip("/"):
        raise ValueError(f"router URL {url!r} is not http(s)://host:port")
    return url.rstrip("/")


@dataclass
class WorkerPlan:
    """What to change: addresses to add and to remove, and what the apply reports."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    result: ApplyResult = field(default_factory=ApplyResult)


def wanted(node: NodeWeight, remove_below: float) -> bool:
    """Whether the router should route to ``node`` (module docstring)."""
    if node.quarantined:
        return False
    return remove_below <= 0 or node.weight >= remove_below * node.base_weight


def plan_worker_set(present: set[str], known: set[str], weights: EffectiveWeights,
                    remove_below: float = 0.0, gateway: str = "the router") -> WorkerPlan:
    """Bring the router's workers (``present``: addresses it routes to or is registering) to
    ``weights`` (pure). ``known``: the addresses the agent may add (module docstring). Raises
    ApplyError (:func:`agent.base.refuse_no_backend`) when the router would be left with none."""
    plan = WorkerPlan()
    named: set[str] = set()
    for node in sorted(weights.nodes, key=lambda n: n.node):
        addr = node.address
        named.add(addr)
        if addr not in present and addr not in known:
            plan.result.missing.append(f"{node.node} ({addr})")
            continue
        if wanted(node, remove_below):
            if addr not in present:
                plan.add.append(addr)
        elif addr in present:
            plan.remove.append(addr)
    after = (present - set(plan.remove)) | set(plan.add)
    if plan.remove:  # never the last worker: the whole change is refused, the router keeps its set
        refuse_no_backend(len(after), gateway, f" (removing {', '.join(sorted(plan.remove))})")
    plan.result.unknown = sorted(present - named)
    return plan


class RouterAPI:
    """The router's admin routes through the agent's one admin-API client (:class:`AdminAPI`: bounded,
    retried with backoff, every failed try counted), with its bearer credential if it has one."""

    def __init__(self, base_url: str, gateway: str, *, api_key: str | None = None,
                 timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.admin = AdminAPI(check_router_url(base_url), what=gateway, timeout_s=timeout_s,
                              attempts=CALL_ATTEMPTS, backoff_s=BACKOFF_S, gateway=gateway)
        self.base_url = self.admin.base_url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def call(self, method: str, path: str, body: Any = None, *, accept: tuple[int, ...] = (),
             raw: bool = False) -> tuple[int, Any]:
        """``(status, body)``: JSON (text when ``raw``); a 4xx in ``accept`` is returned with its body
        (JSON when it is), any other raises :class:`ApplyError`."""
        try:
            resp = self.admin.request(method, path, body, headers=self.headers, raw=raw)
        except AdminAPIRefused as exc:
            if exc.status not in accept:
                raise
            try:
                return exc.status, json.loads(exc.detail)
            except ValueError:
                return exc.status, exc.detail
        return resp.status, resp.body


class WorkerSetApplier:
    """Common apply of the worker-API routers; a subclass lists, adds and removes workers.

    ``router_workers``: worker URLs the agent may add (the operator's list); ``remove_below``: the
    fraction of its base weight under which a node is removed although not quarantined (0: never).
    """

    name = ""

    def __init__(self, api: RouterAPI, *, router_workers: list[str] | tuple[str, ...] = (),
                 remove_below: float = 0.0) -> None:
        if not 0.0 <= remove_below <= 1.0:
            raise ValueError("remove_below must be in 0..1 (a fraction of the base weight)")
        self.api = api
        self.remove_below = remove_below
        #: address -> worker URL the agent may register (operator's list, first sight, own removals).
        self.known: dict[str, str] = {worker_address(u): u.rstrip("/") for u in router_workers}
        self._seen_router = False

    # --- what a subclass provides -------------------------------------------------------------
    def list_workers(self) -> dict[str, Any]:
        """``{address: handle}`` of the workers the router routes to or is registering."""
        raise NotImplementedError

    def add_worker(self, address: str, url: str) -> None:
        raise NotImplementedError

    def remove_worker(self, address: str, handle: Any) -> None:
        raise NotImplementedError

    # --- the apply ----------------------------------------------------------------------------
    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        present = self.list_workers()
        if not self._seen_router:
            # The router's own list when the agent first sees it is the operator's configuration.
            for addr, handle in present.items():
                self.known.setdefault(addr, self.url_of(addr, handle))
            self._seen_router = True
        plan = plan_worker_set(set(present), set(self.known), weights, self.remove_below, self.name)
        result = plan.result
        for addr in plan.add:  # adds first: a failure half-way never leaves fewer workers
            self.add_worker(addr, self.known[addr])
            result.changes.append(f"added worker {self.known[addr]}")
        for addr in plan.remove:
            self.known.setdefault(addr, self.url_of(addr, present[addr]))
            self.remove_worker(addr, present[addr])
            result.changes.append(f"removed worker {self.known[addr]}")
        return result

    def url_of(self, address: str, handle: Any) -> str:
        """The URL to register ``address`` with again (the router's own spelling)."""
        return f"http://{address}"

    def set_safeguard(self, active: bool) -> None:
        """Neither router has a place for the flag: it stays in the agent's logs and metrics."""
        return


def by_address(urls: Mapping[str, Any] | list[str]) -> dict[str, Any]:
    """``{address: url}`` for worker URLs (those that do not parse are left out, logged)."""
    out: dict[str, Any] = {}
    for url in urls:
        try:
            out[worker_address(url)] = url
        except ValueError as exc:
            log.warning("router worker left alone: %s", exc)
    return out
