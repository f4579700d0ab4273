"""Envoy integration: the weights into the EDS file of a cluster Envoy watches (filesystem xDS).

Envoy cluster configuration (type EDS, filesystem config source, as ``docs/gateways.md`` shows)::

    node: {id: gw-1, cluster: llm}          # a filesystem subscription needs both, like any xDS one
    clusters:
    - name: llm
      type: EDS
      lb_policy: LEAST_REQUEST               # or ROUND_ROBIN; both honour load_balancing_weight
      eds_cluster_config:
        eds_config:
          resource_api_version: V3
          path_config_source:
            path: /etc/envoy/eds/llm.json
            watched_directory: {path: /etc/envoy/eds}

The file holds a ``DiscoveryResponse`` (JSON) with one ``ClusterLoadAssignment`` resource. **The
operator writes it first** with the cluster's backends (:func:`seed_discovery_response` renders one):
the endpoints it lists are the backends Envoy knows, and the agent never adds or removes one; it sets
each known endpoint's ``load_balancing_weight`` and ``health_status`` from the document (the way the
HAProxy applier treats the servers of a backend). A document node with no endpoint in the file is
skipped and reported (``missing``; ``outlier_agent_missing_nodes``); an endpoint matching no node is
left as it is (``unknown``). Nodes and endpoints are matched by ``address:port``.

* a quarantined node: ``health_status: DRAINING``. Envoy's load balancer sends a draining host no
  new requests (``/clusters`` shows ``/eds_status_draining``) and lets the requests under way finish;
  the endpoint stays in the file, so restoring it is one more rewrite. Keep the cluster's panic
  threshold (default 50%) above the control plane's 30% quarantine cap, or Envoy would route to
  draining hosts in panic mode.
* any other node: ``HEALTHY`` with ``load_balancing_weight = max(1, weight)`` (a UInt32 ``>= 1``; our
  base weight 100 is the operator's seed weight, a soft-degraded node at 35 gets 35/100 of a share).
* a change after which no endpoint of the cluster would take requests is refused
  (:func:`~agent.base.refuse_no_backend`): the previous file stays.

Envoy only notices a file *moved* into the watched directory, so the new text is written to a temp
file there and renamed over the target (``write_atomically``); nothing is written when it renders the
same bytes. ``version_info`` is a digest of the assignment (the routing content, not the document
version), so unchanged weights render identical bytes. Envoy loads it within milliseconds (docs/gateways.md).

With ``admin_url`` (Envoy's admin interface) every apply is confirmed: the applier reads
``/clusters?format=json`` until each endpoint it set shows the weight and EDS health it wrote
(``confirm_timeout_s``); an Envoy that is down or did not load the file (it logs why: a rejected
file keeps the previous assignment) makes the apply fail (counted, retried by the agent).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agent.adminapi import AdminAPI
from agent.base import ApplyError, ApplyResult, refuse_no_backend
from agent.client import EffectiveWeights
from agent.configfile import ConfigFileApplier
from contract.weights_document import split_address

CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
#: EDS health statuses under which Envoy's load balancer still sends new requests.
ROUTABLE = {"UNKNOWN", "HEALTHY", "DEGRADED"}
#: A backend's seed weight: the control plane's base weight.
SEED_WEIGHT = 100


def seed_discovery_response(servers: dict[str, str], cluster_name: str, weight: int = SEED_WEIGHT) -> dict[str, Any]:
    """The EDS file an operator starts from: every backend (name -> ``host:port``) ``HEALTHY`` at ``weight``."""
    eps = []
    for name, address in servers.items():
        host, port = split_address(address)
        eps.append({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}},
                                 "hostname": name},
                    "health_status": "HEALTHY", "load_balancing_weight": weight})
    cla = {"@type": CLA_TYPE, "cluster_name": cluster_name, "endpoints": [{"lb_endpoints": eps}]}
    return {"version_info": _digest(cla), "resources": [cla]}


def _digest(cla: dict[str, Any]) -> str:
    return "oa-" + hashlib.sha1(json.dumps(cla, sort_keys=True).encode()).hexdigest()[:16]


def endpoint_address(ep: dict[str, Any]) -> str:
    """``host:port`` of an ``LbEndpoint`` (``ValueError`` when it has no socket address)."""
    try:
        sa = ep["endpoint"]["address"]["socket_address"]
        return f"{sa['address']}:{int(sa['port_value'])}"
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an lb_endpoint without endpoint.address.socket_address: {ep!r:.200}") from exc


def _assignment(body: Any, cluster_name: str) -> dict[str, Any]:
    try:
        resources = body["resources"]
        cla = next(r for r in resources if r.get("cluster_name") == cluster_name)
    except (TypeError, KeyError, AttributeError, StopIteration):
        raise ApplyError(f"no ClusterLoadAssignment for cluster {cluster_name!r} in the EDS file") from None
    if not isinstance(cla.get("endpoints", []), list):
        raise ApplyError("ClusterLoadAssignment.endpoints is not a list")
    return cla


def _lb_endpoints(cla: dict[str, Any]) -> list[dict[str, Any]]:
    return [ep for locality in cla.get("endpoints", []) for ep in locality.get("lb_endpoints", [])]


def plan_assignment(body: dict[str, Any], weights: EffectiveWeights,
                    cluster_name: str) -> tuple[dict[str, Any], ApplyResult, dict[str, tuple[str, int]]]:
    """The EDS body with ``weights`` applied to the endpoints it lists (pure; module docstring).

    Returns ``(new_body, result, targets)``: ``result`` names the changes, unknown endpoints and
    missing nodes; ``targets`` maps each endpoint set to its ``(health_status, weight)``."""
    new = copy.deepcopy(body)
    cla = _assignment(new, cluster_name)
    before = copy.deepcopy(cla)
    by_addr: dict[str, dict[str, Any]] = {}
    for ep in _lb_endpoints(cla):
        try:
            by_addr[endpoint_address(ep)] = ep
        except ValueError as exc:
            raise ApplyError(str(exc)) from None
    result = ApplyResult()
    targets: dict[str, tuple[str, int]] = {}
    for node in weights.nodes:
        host, port = split_address(node.address)
        key = f"{host}:{port}"
        ep = by_addr.get(key)
        if ep is None:
            result.missing.append(f"{node.node} ({node.address})")
            continue
        target = ("DRAINING", 1) if node.quarantined else ("HEALTHY", max(1, node.weight))
        now = (ep.get("health_status", "UNKNOWN"), int(ep.get("load_balancing_weight", 1)))
        if now != target:
            result.changes.append(f"{key} {target[0]} weight={target[1]} (was {now[0]} weight={now[1]})")
        ep["health_status"], ep["load_balancing_weight"] = target
        targets[key] = target
    result.unknown = sorted(set(by_addr) - set(targets))
    routable = sum(ep.get("health_status", "UNKNOWN") in ROUTABLE for ep in by_addr.values())
    refuse_no_backend(routable, f"Envoy cluster {cluster_name!r}", f" ({len(by_addr)} endpoints in the file)")
    if cla != before:  # an unchanged assignment keeps the operator's version_info: nothing to write
        new["version_info"] = _digest(cla)
    return new, result, targets


class EnvoyApplier(ConfigFileApplier):
    """Rewrites the EDS file of one Envoy cluster (module docstring)."""

    name = "envoy"
    router = "Envoy"
    hint = ("write the EDS file first with the cluster's endpoints (docs/gateways.md, Envoy); the agent only "
            "sets their weights and health")
    poll_s = 0.02

    def __init__(self, eds_path: str | os.PathLike[str], cluster_name: str, *, admin_url: str | None = None,
                 confirm_timeout_s: float = 5.0) -> None:
        super().__init__(eds_path, api=AdminAPI(admin_url, what="Envoy admin") if admin_url else None,
                         confirm_timeout_s=confirm_timeout_s)
        self.cluster_name = cluster_name

    @property
    def eds_path(self) -> Path:
        return self.path

    def plan(self, body: Any, weights: EffectiveWeights) -> tuple[Any, ApplyResult, dict[str, tuple[str, int]]]:
        return plan_assignment(body, weights, self.cluster_name)

    def running(self) -> dict[str, tuple[str, int]]:
        """``host:port -> (EDS health, weight)`` of the endpoints the agent sets, from ``/clusters``."""
        assert self.api is not None
        targets = self._unconfirmed or {}
        data = self.api.get("/clusters?format=json")
        out: dict[str, tuple[str, int]] = {}
        for cluster in (data or {}).get("cluster_statuses", []):
            if cluster.get("name") != self.cluster_name:
                continue
            for host in cluster.get("host_statuses", []):
                try:
                    sa = host["address"]["socket_address"]
                    key = f"{sa['address']}:{int(sa['port_value'])}"
                    status = host.get("health_status", {}).get("eds_health_status", "UNKNOWN")
                    if key in targets:
                        out[key] = (status, int(host.get("weight", 1)))
                except (KeyError, TypeError, ValueError):
                    continue
        return out
