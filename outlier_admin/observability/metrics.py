"""Prometheus metrics. Every series is named ``outlier_*``.

Two kinds, so that ``/metrics`` is right whichever process serves the scrape:

* **Fleet state** (per node state / weight / Z / EMA, per group baseline / safeguard / nodes by state,
  weights-document age, canary verdicts, pending proposals) is read at scrape time from the database
  and Redis by :class:`FleetCollector` — the database is the source of truth, so every web worker
  answers the same numbers and nothing has to be kept in process memory. While the database is
  down only its part is skipped (``outlier_metrics_sql_up 0``); the weights documents (Redis) and
  the events below are still served.
* **Events** (ingest records, ticks, publish latency, alerts) are counters and histograms defined
  here and recorded by :mod:`outlier_admin.observability.hooks` in the process where they happen.
  With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn, Celery prefork; a Celery worker makes a private
  one when it is unset, :func:`outlier_admin.observability.worker_metrics.ensure_multiprocess_dir`)
  ``prometheus_client`` writes them to per-process files and :func:`render` merges them
  (``MultiProcessCollector``); without it (the demo, tests) they live in :data:`EVENTS`.

The group is labelled ``group`` in every series (and in the alerts' labels), never another name: rules
and dashboards join series on it.

Series (labels):

=========================================  ====================================================
``outlier_node_state``                      1 for the node's current state, 0 for the others
                                            (group, node, state)
``outlier_node_weight`` / ``_base_weight``  published weight / configured base weight
``outlier_node_z``, ``outlier_node_ema``    latest Z-score and EMA per signal (group, node, signal)
``outlier_group_baseline``                  the detector's stored peer baseline per group and
                                            signal (what every Z was measured against)
``outlier_group_safeguard``                 1 while the 30 % safeguard holds quarantines back
``outlier_group_nodes``                     nodes per state (group, state)
``outlier_weights_version``                 version of the published weights document
``outlier_weights_age_seconds``             now - ``generated_at`` of the document (publish lag
                                            as a gateway sees it; > ``stale_after_s`` = fail open)
``outlier_proposals_pending``               quarantine proposals waiting for a human
``outlier_canary_probes_total``             judged canary probes (group, verdict=passed|failed)
``outlier_canary_probes_pending``           probes sent but not judged yet
``outlier_ingest_records_total``            records by source kind and result (accepted|duplicate|rejected)
``outlier_ingest_rejected_total``           rejected records by source and reason
``outlier_tick_duration_seconds``           histogram of detector tick durations (group)
``outlier_publish_latency_seconds``         histogram, decision -> document in Redis (group)
``outlier_tick_samples_total``              samples applied by ticks (group)
``outlier_transitions_total``               node transitions seen by the event scan (group, to_state),
                                            the canary's cycles within an incident aside: one
                                            incident's quarantine counts 1 however often it is probed
``outlier_canary_cycles_total``             those cycles (group, outcome=probe_due|probe_failed|
                                            recovery_step_failed)
``outlier_incidents_total``                 incidents started (group; :mod:`outlier_admin.control.incidents`)
``outlier_incidents_ended_total``           incidents ended (group, outcome=fault_confirmed|
                                            no_fault_found|operator|retired)
``outlier_incidents_open``                  incidents open now (group)
``outlier_alerts_total``                    alert deliveries (receiver kind, result=sent|failed)
``outlier_scrape_failures_total``           failed model-server scrapes (group, node, kind; kinds in
                                            :data:`outlier_admin.ingest.scraper.KINDS`)
``outlier_dcgm_scrape_failures_total``      failed dcgm-exporter scrapes (group, node, kind; kinds in
                                            :data:`outlier_admin.ingest.dcgm.KINDS`)
``outlier_metrics_sql_up``                  1 if the scrape read the fleet state from the database,
                                            0 if not (the SQL-backed series above are then absent)
=========================================  ====================================================

With a Redis Cluster, ``outlier_redis_cluster_redirections_total`` (kind=moved|ask) counts the
redirections redis-py followed: a burst is a resharding or a failover under way.

Ingest ``source`` labels are a closed set (``http``, ``logs``, ``scrape``, ``demo``, ``other``; see
:func:`outlier_admin.observability.hooks.source_label`): the gateway token's or log source's own
name stays in the database (``RejectedInput.source``), never in a label anyone scraping can read.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contract import keys
from contract.weights_document import DocumentError, WeightsDocument

#: In-process registry of the event metrics (used when not in multi-process mode).
EVENTS = CollectorRegistry(auto_describe=True)

INGEST_RECORDS = Counter(
    "outlier_ingest_records", "Ingested records by source and result (accepted, duplicate, rejected).",
    ["source", "result"], registry=EVENTS,
)
INGEST_REJECTED = Counter(
    "outlier_ingest_rejected", "Rejected ingest records by source and reason code.",
    ["source", "reason"], registry=EVENTS,
)
INGEST_THROTTLED = Counter(
    "outlier_ingest_throttled", "Ingest requests refused with 429 by token and limit (concurrency: requests in "
    "progress, bytes: body bytes a second; outlier_admin.ingest.throttle).", ["token", "limit"], registry=EVENTS,
)
TICK_DURATION = Histogram(
    "outlier_tick_duration_seconds", "Duration of one detector tick of a group.", ["group"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=EVENTS,
)
PUBLISH_LATENCY = Histogram(
    "outlier_publish_latency_seconds", "Time from the detector's decision to the weights document in Redis.",
    ["group"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), registry=EVENTS,
)
TICK_SAMPLES = Counter("outlier_tick_samples", "Samples applied to the detector by ticks.", ["group"],
                       registry=EVENTS)
TRANSITIONS = Counter("outlier_transitions", "Node state transitions seen by the event scan, the canary's "
                      "cycles within an incident aside (outlier_canary_cycles_total).",
                      ["group", "to_state"], registry=EVENTS)
CANARY_CYCLES = Counter("outlier_canary_cycles", "The canary's transitions within an incident, by outcome "
                        "(probe_due, probe_failed, recovery_step_failed): each a probe outcome, not a new "
                        "quarantine.", ["group", "outcome"], registry=EVENTS)
ALERTS = Counter("outlier_alerts", "Alert deliveries by receiver kind and result (sent, failed).",
                 ["receiver", "result"], registry=EVENTS)
SCRAPE_FAILURES = Counter(
    "outlier_scrape_failures", "Failed model-server /metrics scrapes by group, node and kind "
    "(timeout, connect, http_status, too_large, protocol, parse).", ["group", "node", "kind"], registry=EVENTS,
)

DCGM_SCRAPE_FAILURES = Counter(
    "outlier_dcgm_scrape_failures", "Failed dcgm-exporter scrapes by group, node and kind (the model-server "
    "kinds, and bad_url, forbidden_address, database).", ["group", "node", "kind"], registry=EVENTS,
)

REDIS_REDIRECTIONS = Counter(
    "outlier_redis_cluster_redirections", "MOVED and ASK replies from a Redis Cluster (kind=moved|ask), each "
    "retried by redis-py: a burst is a resharding or a failover under way.", ["kind"], registry=EVENTS,
)


def count_redirection(kind: str) -> None:
    """The listener of a Redis Cluster client's redirections (``contract.topology.on_redirection``),
    registered once per process by the observability app."""
    REDIS_REDIRECTIONS.labels(kind).inc()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The body of a refused scrape (web ``/metrics`` and the Celery workers' server alike).
UNAUTHORIZED_MESSAGE = "metrics need 'Authorization: Bearer <METRICS_TOKEN>'"
log = logging.getLogger(__name__)


def scrape_allowed(authorization: str | None, token: str | None = None) -> bool:
    """True if a scrape with this ``Authorization`` header may read the metrics: always when no token
    is configured (``token``, default ``settings.METRICS_TOKEN``), else only with ``Bearer <token>``.

    The one check for every server of these metrics (the web view and the worker's own server).
    Both sides are hashed before the constant-time compare, so neither the token's content nor its
    length leaks through the time the comparison takes."""
    if token is None:
        from django.conf import settings

        token = settings.METRICS_TOKEN
    if not token:
        return True
    scheme, _, sent = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(hashlib.sha256(sent.strip().encode()).digest(),
                               hashlib.sha256(token.encode()).digest())


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


class FleetCollector(Collector):
    """Fleet state read from the database and Redis at scrape time (see module docstring).

    A database outage (:func:`outlier_admin.outage.is_database_outage`) costs only the
    SQL-backed families: the weights documents are still read from Redis (groups listed from Redis
    then), ``outlier_metrics_sql_up`` says 0, and the event series rendered next to this collector
    (ingest, ticks) are served as usual — an outage is when they matter most."""

    def collect(self) -> Iterator[Metric]:
        from outlier_admin.outage import is_database_outage

        sql_up = GaugeMetricFamily("outlier_metrics_sql_up",
                                   "1 if this scrape read the fleet state from the database, 0 if it failed.")
        try:
            families, groups = self._sql_families()
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("metrics: SQL-backed fleet series skipped (database unavailable): %s: %s",
                        type(exc).__name__, str(exc).strip()[:300])
            families, groups = [], None
        sql_up.add_metric([], 0.0 if groups is None else 1.0)
        yield from families
        yield from self._weights_families(groups)
        yield sql_up

    def _sql_families(self) -> tuple[list[Metric], list[str]]:
        """The SQL-backed families, all built before any is returned (a failure midway yields none),
        and the group names."""
        from outlier_admin.fleet.models import ModelGroup

        groups = {g.pk: g.name for g in ModelGroup.objects.only("id", "name")}
        (m_state, m_weight, m_base, m_nodes), node_meta = _node_families(groups)
        families: list[Metric] = [m_state, m_weight, m_base, *_signal_families(groups, node_meta), m_nodes,
                                  _proposal_family(groups), *_canary_families(groups), *_incident_families(groups)]
        return families, list(groups.values())

    def _weights_families(self, groups: list[str] | None) -> list[Metric]:
        """Safeguard, version and age of each group's weights document (Redis). ``groups`` None: the
        database is down, list the groups the ticks registered in Redis instead."""
        from outlier_admin.control.outage_store import known_groups
        from outlier_admin.control.redis_conn import get_redis, mget

        m_safeguard = GaugeMetricFamily("outlier_group_safeguard",
                                        "1 while the safeguard holds quarantines back.", labels=["group"])
        m_version = GaugeMetricFamily("outlier_weights_version", "Version of the published weights document.",
                                      labels=["group"])
        m_age = GaugeMetricFamily("outlier_weights_age_seconds",
                                  "Seconds since the weights document was generated (publish lag).",
                                  labels=["group"])
        now = time.time()
        try:
            r = get_redis()
            if groups is None:
                groups = known_groups(r)
            raw_docs = mget(r, [keys.weights(g) for g in groups])
        except Exception:  # Redis down: the fleet gauges above are still worth serving
            raw_docs = []
        for gname, raw in zip(groups or [], raw_docs, strict=False):
            if raw is None:
                continue
            try:
                doc = WeightsDocument.from_json(raw)
            except DocumentError:  # the gateways refuse it too: nothing to report
                continue
            m_safeguard.add_metric([gname], 1.0 if doc.safeguard else 0.0)
            m_version.add_metric([gname], float(doc.version))
            m_age.add_metric([gname], max(0.0, doc.age_s(now)))
        return [m_safeguard, m_version, m_age]


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (gunicorn / Celery prefork), else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render(*, fleet: bool = True) -> bytes:
    """The text exposition of every ``outlier_*`` series (events merged across processes when in
    multi-process mode, plus the fleet state when ``fleet``)."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Events())
    if fleet:
        registry.register(FleetCollector())
    return generate_latest(registry)


class _Events(Collector):
    """Adapter: the in-process event registry as one collector of another registry."""

    def collect(self) -> Iterator[Metric]:
        yield from EVENTS.collect()


def _node_families(groups: dict[int, str]) -> tuple[list[Metric], dict[int, tuple[str, str, str]]]:
    """Each node's state, weight and base weight, each group's nodes per state; and each node's
    ``(group, name, state)`` by id."""
    from detector.states import NodeState
    from outlier_admin.fleet.models import Node

    states = [s.label for s in NodeState]
    m_state = GaugeMetricFamily("outlier_node_state", "1 for the node's current state, 0 otherwise.",
                                labels=["group", "node", "state"])
    m_weight = GaugeMetricFamily("outlier_node_weight", "Published weight of the node.", labels=["group", "node"])
    m_base = GaugeMetricFamily("outlier_node_base_weight", "Configured base weight of the node.",
                               labels=["group", "node"])
    m_nodes = GaugeMetricFamily("outlier_group_nodes", "Nodes of the group per state.", labels=["group", "state"])
    nodes = list(Node.objects.filter(retired=False).values_list("id", "group_id", "name", "state", "weight",
                                                                "base_weight"))
    by_group_state: dict[tuple[str, str], int] = {}
    node_meta: dict[int, tuple[str, str, str]] = {}
    for pk, gid, name, state, weight, base in nodes:
        group = groups.get(gid, "?")
        node_meta[pk] = (group, name, state)
        for s in states:
            m_state.add_metric([group, name, s], 1.0 if s == state else 0.0)
        m_weight.add_metric([group, name], float(weight))
        m_base.add_metric([group, name], float(base))
        by_group_state[(group, state)] = by_group_state.get((group, state), 0) + 1
    for gname in groups.values():
        for s in states:
            m_nodes.add_metric([gname, s], float(by_group_state.get((gname, s), 0)))
    return [m_state, m_weight, m_base, m_nodes], node_meta


def _signal_families(groups: dict[int, str], node_meta: dict[int, tuple[str, str, str]]) -> list[Metric]:
    """Each node's latest Z and EMA per signal, and each group's stored peer baseline per signal."""
    from django.conf import settings
    from django.utils import timezone

    from outlier_admin.control.models import GroupBaseline, NodeHistory

    m_z = GaugeMetricFamily("outlier_node_z", "Latest Z-score of the node against its peers.",
                            labels=["group", "node", "signal"])
    m_ema = GaugeMetricFamily("outlier_node_ema", "Latest EMA of the node's normalised latency.",
                              labels=["group", "node", "signal"])
    m_baseline = GaugeMetricFamily("outlier_group_baseline",
                                   "The detector's peer baseline of the group, per signal (stored by the tick).",
                                   labels=["group", "signal"])
    baselines: dict[tuple[str, str], float] = {}
    # Latest history row per node and signal: rows are written at least every HISTORY_EVERY_S,
    # so a short look-back window finds them without scanning the table.
    since = timezone.now() - timedelta(seconds=max(60, 6 * settings.HISTORY_EVERY_S))
    latest: dict[tuple[int, str], tuple[Any, Any]] = {}
    rows = NodeHistory.objects.filter(at__gte=since, node_id__in=list(node_meta)).order_by("at")
    for node_id, signal, z, ema in rows.values_list("node_id", "signal", "z", "ema").iterator():
        latest[(node_id, signal)] = (z, ema)
    for (node_id, signal), (z, ema) in latest.items():
        group, name, _state = node_meta[node_id]
        m_z.add_metric([group, name, signal], _num(z))
        m_ema.add_metric([group, name, signal], _num(ema))
    # The detector's own baseline, as stored by the tick with the history rows: what every Z was
    # measured against (a median recomputed here would differ: other nodes, another moment).
    stored = GroupBaseline.objects.filter(at__gte=since, baseline__isnull=False).order_by("at")
    for gid, signal, value in stored.values_list("group_id", "signal", "baseline").iterator():
        if gid in groups:
            baselines[(groups[gid], signal)] = value
    for (group, signal), value in baselines.items():
        m_baseline.add_metric([group, signal], float(value))
    return [m_z, m_ema, m_baseline]


def _proposal_family(groups: dict[int, str]) -> Metric:
    """Each group's quarantine proposals waiting for a human."""
    from outlier_admin.control.models import ProposalStatus, QuarantineProposal

    m_props = GaugeMetricFamily("outlier_proposals_pending", "Quarantine proposals waiting for a human.",
                                labels=["group"])
    pending: dict[str, int] = {g: 0 for g in groups.values()}
    for gid in QuarantineProposal.objects.filter(status=ProposalStatus.PENDING).values_list("group_id", flat=True):
        pending[groups.get(gid, "?")] = pending.get(groups.get(gid, "?"), 0) + 1
    for gname, n in pending.items():
        m_props.add_metric([gname], float(n))
    return m_props


def _canary_families(groups: dict[int, str]) -> list[Metric]:
    """Each group's judged canary probes by verdict, and those not judged yet."""
    from django.db.models import Count, Q

    from outlier_admin.control.models import CanaryProbe

    m_canary = CounterMetricFamily("outlier_canary_probes", "Judged canary probes by verdict.",
                                   labels=["group", "verdict"])
    m_canary_pending = GaugeMetricFamily("outlier_canary_probes_pending", "Canary probes not judged yet.",
                                         labels=["group"])
    verdicts: dict[tuple[str, str], int] = {}
    waiting: dict[str, int] = {g: 0 for g in groups.values()}
    for gid, passed, applied, n in (CanaryProbe.objects.annotate(applied=Q(applied_at__isnull=False))
                                    .values_list("node__group_id", "passed", "applied").annotate(n=Count("id"))):
        gname = groups.get(gid, "?")
        if passed is None and not applied:  # applied without a verdict: a sample, not a pending probe
            waiting[gname] = waiting.get(gname, 0) + n
        elif passed is not None:
            key = (gname, "passed" if passed else "failed")
            verdicts[key] = verdicts.get(key, 0) + n
    for gname in groups.values():
        for verdict in ("passed", "failed"):
            m_canary.add_metric([gname, verdict], float(verdicts.get((gname, verdict), 0)))
        m_canary_pending.add_metric([gname], float(waiting.get(gname, 0)))
    return [m_canary, m_canary_pending]


def _incident_families(groups: dict[int, str]) -> list[Metric]:
    """Each group's incidents started, ended by outcome, and open now."""
    from django.db.models import Count

    from outlier_admin.control.models import Incident, IncidentOutcome

    m_incidents = CounterMetricFamily("outlier_incidents", "Incidents started (a node's episode out of full "
                                      "service).", labels=["group"])
    m_ended = CounterMetricFamily("outlier_incidents_ended", "Incidents ended, by outcome.",
                                  labels=["group", "outcome"])
    m_open = GaugeMetricFamily("outlier_incidents_open", "Incidents open now.", labels=["group"])
    started: dict[str, int] = {g: 0 for g in groups.values()}
    ended: dict[tuple[str, str], int] = {}
    still: dict[str, int] = {g: 0 for g in groups.values()}
    for gid, outcome, n in Incident.objects.values_list("group_id", "outcome").annotate(n=Count("id")):
        gname = groups.get(gid, "?")
        started[gname] = started.get(gname, 0) + n
        if outcome:
            ended[(gname, outcome)] = ended.get((gname, outcome), 0) + n
        else:
            still[gname] = still.get(gname, 0) + n
    for gname, n in started.items():
        m_incidents.add_metric([gname], float(n))
        m_open.add_metric([gname], float(still.get(gname, 0)))
        for outcome in IncidentOutcome.values:
            m_ended.add_metric([gname, outcome], float(ended.get((gname, outcome), 0)))
    return [m_incidents, m_ended, m_open]
