"""Envoy integration: an EDS ``ClusterLoadAssignment`` in a file Envoy watches.

Envoy cluster configuration (type EDS, filesystem config source)::

    clusters:
    - name: llama-70b
      type: EDS
      eds_cluster_config:
        eds_config:
          path_config_source:
            path: /etc/envoy/eds/llama-70b.json
            watched_directory: {path: /etc/envoy/eds}

The file holds a ``DiscoveryResponse`` (JSON) with one resource of type
``type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment``. Envoy only notices a file
that is *moved* into place, so it is written to a temp file in the same directory and renamed over
the target (``write_atomically``); nothing is written when the rendered JSON is unchanged.

Weights: ``load_balancing_weight`` is a UInt32 with ``gte: 1`` (Envoy cannot take 0), so a
quarantined node keeps weight 1 and gets ``health_status: DRAINING``, which Envoy's load balancer
excludes. Keep the cluster's panic threshold (default 50%) above the safeguard's 30% cap, otherwise
Envoy would route to draining hosts in panic mode. Healthy nodes are ``HEALTHY`` with
``max(1, weight)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agent.base import ApplyResult
from agent.client import EffectiveWeights
from agent.nginx import write_atomically

CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def render_cluster_load_assignment(weights: EffectiveWeights, cluster_name: str) -> dict[str, Any]:
    """The ClusterLoadAssignment for ``weights`` (one locality, endpoints sorted by address)."""
    lb_endpoints = []
    for node in sorted(weights.nodes, key=lambda n: n.address):
        lb_endpoints.append(
            {
                "endpoint": {
                    "address": {"socket_address": {"address": node.host, "port_value": node.port}},
                    "hostname": node.node,
                },
                "health_status": "DRAINING" if node.quarantined else "HEALTHY",
                "load_balancing_weight": 1 if node.quarantined else max(1, node.weight),
            }
        )
    return {"@type": CLA_TYPE, "cluster_name": cluster_name, "endpoints": [{"lb_endpoints": lb_endpoints}]}


def render_discovery_response(weights: EffectiveWeights, cluster_name: str) -> str:
    """The file body: a DiscoveryResponse with the assignment. ``version_info`` is the routing content
    (mode + weights), not the document version, so an unchanged assignment renders identical bytes."""
    cla = render_cluster_load_assignment(weights, cluster_name)
    digest = hashlib.sha1(json.dumps(cla, sort_keys=True).encode()).hexdigest()[:16]
    body = {"version_info": f"{weights.mode}-{digest}", "resources": [cla]}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


class EnvoyApplier:
    """Writes the EDS file for one Envoy cluster."""

    name = "envoy"

    def __init__(self, eds_path: str | os.PathLike[str], cluster_name: str) -> None:
        self.eds_path = Path(eds_path)
        self.cluster_name = cluster_name

    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        new = render_discovery_response(weights, self.cluster_name)
        try:
            old: str | None = self.eds_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            old = None
        if new == old:
            return ApplyResult()
        write_atomically(self.eds_path, new)
        changes = []
        before = _endpoint_map(old)
        for ep in json.loads(new)["resources"][0]["endpoints"][0]["lb_endpoints"]:
            sa = ep["endpoint"]["address"]["socket_address"]
            key = f"{sa['address']}:{sa['port_value']}"
            now = (ep["health_status"], ep["load_balancing_weight"])
            if before.get(key) != now:
                changes.append(f"{key} {now[0]} weight={now[1]}")
        return ApplyResult(changes=changes or [f"rewrote {self.eds_path}"])

    def set_safeguard(self, active: bool) -> None:
        # EDS has no field for it; exposed through the agent's metrics and status file.
        return None


def _endpoint_map(text: str | None) -> dict[str, tuple[str, int]]:
    if not text:
        return {}
    try:
        eps = json.loads(text)["resources"][0]["endpoints"][0]["lb_endpoints"]
        return {
            f"{e['endpoint']['address']['socket_address']['address']}:"
            f"{e['endpoint']['address']['socket_address']['port_value']}": (
                e["health_status"], e["load_balancing_weight"])
            for e in eps
        }
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
