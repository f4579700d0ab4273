"""Traefik integration: the weights into the agent's file of Traefik's file provider (Traefik 3.x).

Traefik's static configuration watches a directory (``docs/gateways.md``, Traefik)::

    providers:
      file: {directory: /etc/traefik/dynamic, watch: true}

and the operator's routers there send to the service ``llm@file``. The service lives in **the
agent's file**, ``/etc/traefik/dynamic/outlier-llm.yaml``, which the operator writes first (the
same shape :func:`seed_service_file` renders; JSON is YAML, and the agent reads and writes the JSON
form so it needs no YAML library)::

    {"http": {"services": {"llm": {"loadBalancer": {
        "strategy": "leasttime",
        "passiveHealthCheck": {"failureWindow": "3s", "maxFailedAttempts": 3},
        "servers": [{"url": "http://10.0.0.7:8000", "weight": 100}, ...]}}}}}

The servers it lists are the backends Traefik knows; the agent changes only their ``weight`` and
which list they are in, and keeps every other key (strategy, health checks, sticky, transport):

* a node with a weight, under ``wrr`` (Traefik's default, smooth weighted round robin): ``weight =
  max(1, weight)`` (the seed's 100 is the control plane's base weight).
* under any other strategy **only quarantine is applied**; the servers keep the weights the operator
  gave them, and a degraded node keeps its full share (the result's ``note`` says so):

  - ``leasttime`` divides its score, ``avg TTFB x (1 + in-flight)``, by the weight, but every change
    of the dynamic configuration builds a new balancer whose servers have no samples, and a server
    with no sample scores 0 (``pkg/server/service/loadbalancer/leasttime``). The healthy servers get
    a sample within a request; the slow one keeps its 0 until its first byte, seconds later, and
    takes every request until then. Measured on 3.7.15 with four 20 ms servers and one of 1 s: 0 of
    60 requests to the slow server before a rewrite, 19 of 60 in the 3 s after one (``python -m
    bench.traefik_reload``: 3 runs, 19-20; ``wrr`` 12, its fifth, before and after). Writing a
    degraded weight therefore *sends* the slow node a burst at every weight change; leasttime's own
    latency score already gives it less, so the agent leaves the weights alone and only moves the
    node out when it is quarantined.
  - ``p2c`` ignores weights (checked on 3.7.15: a server of weight 0 kept its third of the requests);
    ``hrw`` hashes clients by weight, so a weight change would move sessions between servers.
* a quarantined node: its server is moved out of ``servers`` into a service no router uses,
  ``<service>-outlier-quarantined`` in the same file, so Traefik sends it no new request under any
  strategy while the file still remembers it; it moves back when the node is restored (or leaves
  the document, or the document goes stale: fail open).
* a document node with no server in either list is skipped and reported (``missing``); a server
  matching no node is left as it is (``unknown``). Matching is by the URL's ``host:port``.
* a change after which ``servers`` would be empty is refused (``refuse_no_backend``).

The file is written to a temp file in the directory and renamed over the target (the file provider
reads only ``.yaml``/``.yml``/``.toml`` files, so the temp file is never loaded); nothing is written
when it renders the same bytes. Traefik applies a provider's change after its
``providers.providersThrottleDuration`` (default 2 s), so a change takes ~2 s to reach traffic.

With ``api_url`` (Traefik's API: ``api: {}`` on an entry point only the gateway host reaches) every
apply is confirmed: the applier reads ``/api/http/services/<service>@file`` until it shows the
servers and weights it wrote (``confirm_timeout_s``), else the apply fails (counted, retried).
"""

from __future__ import annotations

import copy
import os
import urllib.parse
from typing import Any

from agent.adminapi import AdminAPI, AdminAPIRefused
from agent.base import ApplyError, ApplyResult, refuse_no_backend
from agent.client import EffectiveWeights
from agent.configfile import ConfigFileApplier
from contract.weights_document import split_address

SEED_WEIGHT = 100
#: The strategy under which the agent writes weights (module docstring): under every other one it
#: applies quarantine only.
WEIGHTED_STRATEGY = "wrr"


def parked_service(service: str) -> str:
    """The unused service the quarantined servers of ``service`` are kept in."""
    return f"{service}-outlier-quarantined"


def seed_service_file(servers: dict[str, str], service: str, *, strategy: str = "wrr",
                      load_balancer: dict[str, Any] | None = None, weight: int = SEED_WEIGHT) -> dict[str, Any]:
    """The agent's file as an operator starts it: ``service`` with every backend (name -> ``host:port``)
    at ``weight``; ``load_balancer`` adds keys of the ``loadBalancer`` (health checks...)."""
    lb: dict[str, Any] = {"strategy": strategy, **(load_balancer or {}),
                          "servers": [{"url": f"http://{addr}", "weight": weight} for addr in servers.values()]}
    return {"http": {"services": {service: {"loadBalancer": lb}}}}


def server_address(server: dict[str, Any]) -> str:
    """``host:port`` of a Traefik server (``url``; the scheme's port when it has none)."""
    try:
        parts = urllib.parse.urlsplit(server["url"])
        port = parts.port or {"http": 80, "https": 443}[parts.scheme]
        host = parts.hostname
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"a server without a usable url: {server!r:.200}") from exc
    if not host:
        raise ValueError(f"a server without a host: {server!r:.200}")
    return f"{host}:{port}"


def plan_service_file(body: dict[str, Any], weights: EffectiveWeights,
                      service: str) -> tuple[dict[str, Any], ApplyResult, dict[str, int]]:
    """The agent's file with ``weights`` applied (pure; module docstring). Returns ``(new_body, result,
    routed)``, ``routed`` being the ``host:port -> weight`` of the servers left in ``service``."""
    new = copy.deepcopy(body)
    try:
        services = new["http"]["services"]
        lb = services[service]["loadBalancer"]
        servers = lb["servers"]
        if not isinstance(servers, list):
            raise TypeError
    except (KeyError, TypeError):
        raise ApplyError(f"no http.services.{service}.loadBalancer.servers list in the agent's Traefik file") from None
    parked_name = parked_service(service)
    parked = services.get(parked_name, {}).get("loadBalancer", {}).get("servers", [])
    known: dict[str, dict[str, Any]] = {}
    try:
        for srv in [*servers, *parked]:
            known[server_address(srv)] = srv
    except ValueError as exc:
        raise ApplyError(str(exc)) from None
    in_service = {server_address(s) for s in servers}
    strategy = lb.get("strategy", WEIGHTED_STRATEGY)
    weighted = strategy == WEIGHTED_STRATEGY
    result = ApplyResult()
    out: set[str] = set()
    matched: set[str] = set()
    for node in weights.nodes:
        host, port = split_address(node.address)
        key = f"{host}:{port}"
        srv = known.get(key)
        if srv is None:
            result.missing.append(f"{node.node} ({node.address})")
            continue
        matched.add(key)
        if node.quarantined:
            out.add(key)
            if key in in_service:
                result.changes.append(f"{key} quarantined: moved to {parked_name}")
            continue
        if key not in in_service:
            result.changes.append(f"{key} restored to {service}")
        target = max(1, node.weight)
        if weighted and srv.get("weight", 1) != target:
            result.changes.append(f"{key} weight={target} (was {srv.get('weight', 1)})")
            srv["weight"] = target
    result.unknown = sorted(set(known) - matched)
    # Servers keep the operator's order; a restored one goes back at the end.
    kept = [s for s in servers if server_address(s) not in out]
    restored = [s for s in parked if server_address(s) not in out]
    lb["servers"] = kept + restored
    still_parked = [s for s in parked if server_address(s) in out] + [s for s in servers if server_address(s) in out]
    if still_parked:
        services[parked_name] = {"loadBalancer": {"servers": still_parked}}
    else:
        services.pop(parked_name, None)
    routable = sum(1 for s in lb["servers"] if s.get("weight", 1) > 0)
    refuse_no_backend(routable, f"Traefik service {service!r}", f" ({len(known)} servers in the file)")
    routed = {server_address(s): int(s.get("weight", 1)) for s in lb["servers"]}
    if not weighted:
        degraded = [n.node for n in weights.nodes if not n.quarantined and n.weight < n.base_weight]
        if degraded:
            result.note = (f"under Traefik strategy {strategy!r} the agent applies quarantine only: degraded nodes "
                           f"{', '.join(sorted(degraded))} keep their weight (docs/gateways.md, Traefik; "
                           f"use wrr for weights)")
    return new, result, routed


class TraefikApplier(ConfigFileApplier):
    """Rewrites the agent's file of Traefik's file provider (module docstring)."""

    name = "traefik"
    router = "Traefik"
    hint = ("write the agent's file first with the service's servers, JSON in a .yaml file (docs/gateways.md, "
            "Traefik); the agent only sets their weights")

    def __init__(self, path: str | os.PathLike[str], service: str, *, api_url: str | None = None,
                 confirm_timeout_s: float = 10.0) -> None:
        super().__init__(path, api=AdminAPI(api_url, what="Traefik API") if api_url else None,
                         confirm_timeout_s=confirm_timeout_s)
        if self.path.suffix not in (".yaml", ".yml"):
            raise ValueError(f"the agent's Traefik file must end in .yaml or .yml (JSON inside), got {self.path}")
        self.service = service

    def plan(self, body: Any, weights: EffectiveWeights) -> tuple[Any, ApplyResult, dict[str, int]]:
        return plan_service_file(body, weights, self.service)

    def running(self) -> dict[str, int] | str:
        """``host:port -> weight`` of the service's servers as Traefik runs them (its API)."""
        assert self.api is not None
        try:
            svc = self.api.get(f"/api/http/services/{urllib.parse.quote(self.service, safe='')}@file")
            return {server_address(s): int(s.get("weight", 1)) for s in svc["loadBalancer"]["servers"]}
        except AdminAPIRefused as exc:
            if exc.status != 404:
                raise
            return "no such service"
        except (KeyError, TypeError, ValueError):
            return "unreadable"
