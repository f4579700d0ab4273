"""Prometheus metrics of the agent (``outlier_agent_*``), read from the agent's state at scrape time.

prometheus-client is optional on a gateway host: without it ``start_metrics_server`` logs and does
nothing. Metrics (labels ``group``, ``gateway``):

* ``outlier_agent_last_applied_version``       version of the last applied document
* ``outlier_agent_last_applied_timestamp_seconds``  when it was applied (epoch s)
* ``outlier_agent_weights_age_seconds``        now - generated_at of the last good document (staleness)
* ``outlier_agent_fail_open``                  1 while base weights are applied because the document is stale
* ``outlier_agent_safeguard_active``           1 while the control plane's safeguard is on (admission control)
* ``outlier_agent_apply_errors_total``         applies the gateway refused or that failed
* ``outlier_agent_apply_failures_total``       calls to the gateway that failed (refused, unreachable,
  timed out), each retry counted: a router that is down shows here before an apply gives up
* ``outlier_agent_applies_total``              applies that changed the gateway
* ``outlier_agent_redis_errors_total``         failed Redis reads/subscriptions
* ``outlier_agent_rejected_documents_total``   malformed documents rejected (last good one kept)
* ``outlier_agent_skipped_nodes``              invalid nodes left out of the current document (reasons logged)
* ``outlier_agent_unknown_servers``            gateway servers that match no node (left alone)
* ``outlier_agent_missing_nodes``              nodes with no gateway server
* ``outlier_agent_redis_redirections_total``   ``MOVED``/``ASK`` replies of a Redis Cluster followed (label ``kind``)
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from agent.client import MODE_FAIL_OPEN
from contract.topology import REDIRECTIONS

log = logging.getLogger("agent.metrics")

#: Failed calls to a gateway per gateway kind (``outlier_agent_apply_failures_total{gateway}``),
#: counted by the appliers where they call it (:func:`count_apply_failure`).
APPLY_FAILURES: Counter[str] = Counter()
_failures_lock = threading.Lock()


def count_apply_failure(gateway: str) -> None:
    """One call to ``gateway`` failed (refused, unreachable, timed out); retries count each."""
    with _failures_lock:
        APPLY_FAILURES[gateway] += 1

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # pragma: no cover - gateway hosts may run without prometheus-client
    CollectorRegistry = None  # type: ignore[assignment,misc]


class AgentCollector:
    """Custom collector: every scrape reads ``agent.state`` and the client's counters."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        st = self.agent.state
        stats = self.agent.client.stats
        labels = ["group", "gateway"]
        values = [st.group, st.gateway]

        def gauge(name: str, doc: str, value: float | None) -> Any:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            if value is not None:
                fam.add_metric(values, value)
            return fam

        def counter(name: str, doc: str, value: float) -> Any:
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            return fam

        yield gauge("outlier_agent_last_applied_version", "Version of the last applied weights document.",
                    st.version)
        yield gauge("outlier_agent_last_applied_timestamp_seconds", "When the last apply finished (epoch s).",
                    st.applied_at)
        yield gauge("outlier_agent_weights_age_seconds",
                    "Seconds since the last good weights document was generated.", self.agent.age_s())
        yield gauge("outlier_agent_fail_open", "1 while base weights are applied because the document is stale.",
                    1.0 if st.mode == MODE_FAIL_OPEN else 0.0)
        yield gauge("outlier_agent_safeguard_active", "1 while the control plane's quarantine safeguard is on.",
                    1.0 if st.safeguard else 0.0)
        yield gauge("outlier_agent_unknown_servers", "Gateway servers matching no node (left alone).",
                    len(st.unknown))
        yield gauge("outlier_agent_missing_nodes", "Nodes of the group with no gateway server.", len(st.missing))
        yield gauge("outlier_agent_skipped_nodes", "Invalid nodes left out of the current weights document.",
                    stats.skipped_nodes)
        yield counter("outlier_agent_apply_errors", "Applies that failed.", st.apply_errors)
        yield counter("outlier_agent_applies", "Applies that changed the gateway.", st.applies)
        yield counter("outlier_agent_apply_failures",
                      "Calls to the gateway that failed (refused, unreachable, timed out), retries included.",
                      APPLY_FAILURES[st.gateway])
        yield counter("outlier_agent_redis_errors", "Failed Redis reads or subscriptions.", stats.redis_errors)
        yield counter("outlier_agent_rejected_documents", "Malformed weights documents rejected.",
                      stats.rejected_documents)
        redirections = CounterMetricFamily("outlier_agent_redis_redirections",
                                           "MOVED and ASK replies of a Redis Cluster, each followed by redis-py "
                                           "(a burst: a resharding or a failover).", labels=[*labels, "kind"])
        for kind, n in sorted(REDIRECTIONS.items()):
            redirections.add_metric([*values, kind], n)
        yield redirections


def make_registry(agent: Any) -> Any:
    """A fresh CollectorRegistry holding only the agent's metrics (None without prometheus-client)."""
    if CollectorRegistry is None:
        return None
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    return registry


def start_metrics_server(agent: Any, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns the registry (or None)."""
    registry = make_registry(agent)
    if registry is None:
        log.warning("prometheus-client is not installed: no metrics endpoint")
        return None
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return registry
