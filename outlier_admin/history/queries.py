"""Read queries shared by the API and the dashboard (kept out of views so both stay thin)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from functools import reduce
from operator import or_
from typing import Any

from django.db import connection
from django.db.models import Case, CharField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce

from detector.states import NodeState as S
from outlier_admin.control.models import GroupBaseline, NodeHistory, QuarantineProposal
from outlier_admin.fleet.models import ModelGroup, Node

LATEST_FIELDS = ("ema", "z", "p50", "p99", "samples")
#: Display order of states (also the order of the count columns on the overview).
STATE_ORDER = tuple(s.label for s in (
    S.HEALTHY, S.DEGRADED, S.PENDING_APPROVAL, S.QUARANTINED, S.PROBING, S.RECOVERING, S.WARMING,
    S.FORCED_QUARANTINE, S.FORCED_ACTIVE,
))
#: What needs a person first, at 3 a.m.: a decision waiting, nodes out, nodes cut, nodes on their
#: way back, manual states, then the rest (the first screen and the group page's default sort).
ATTENTION_ORDER = tuple(s.label for s in (
    S.PENDING_APPROVAL, S.QUARANTINED, S.DEGRADED, S.PROBING, S.RECOVERING, S.FORCED_QUARANTINE,
    S.FORCED_ACTIVE, S.WARMING, S.HEALTHY,
))
#: The quiet states, sorted after every other one when a column has no value.
_QUIET = (S.HEALTHY.label, S.WARMING.label)


def attention_rank(state: str) -> int:
    """Position of ``state`` in :data:`ATTENTION_ORDER` (an unknown state right after the listed
    problems, before ``warming`` and ``healthy``)."""
    try:
        return ATTENTION_ORDER.index(state)
    except ValueError:
        return ATTENTION_ORDER.index(S.FORCED_ACTIVE.label) + 1


def judged_signals(groups: QuerySet[ModelGroup] | None = None) -> dict[int, tuple[str, ...]]:
    """``{group_id: signals}``: the signals among which the detector picks each node's deciding signal
    in that group (the heatmap judges its cells among them): the detector's own rule,
    :func:`detector.detectors.zscore.judged_signals`, over each signal's latest stored baseline.

    One query: each queue-free signal's latest stored baseline per group, an index probe each."""
    from detector.detectors.zscore import judged_signals as rule
    from detector.signals import QUEUE_FREE

    stored = {f"stored_{s}": Subquery(GroupBaseline.objects.filter(group=OuterRef("pk"), signal=s)
                                      .order_by("-at").values("baseline")[:1]) for s in QUEUE_FREE}
    out: dict[int, tuple[str, ...]] = {}
    for group in (groups if groups is not None else ModelGroup.objects.all()).annotate(**stored):
        baselines = {s: math.nan if getattr(group, f"stored_{s}") is None else getattr(group, f"stored_{s}")
                     for s in QUEUE_FREE}
        out[group.pk] = rule(baselines, group.thresholds())
    return out


def _latest(signal: str, field: str) -> Subquery:
    """The node's latest ``signal`` history row's ``field`` (an index probe on ``(node, signal, at)``)."""
    return Subquery(NodeHistory.objects.filter(node=OuterRef("pk"), signal=signal).order_by("-at").values(field)[:1])


def with_latest_figures(nodes: QuerySet[Node], signal: str | None = None) -> QuerySet[Node]:
    """Annotate each node with ``latest_signal`` and its latest ``latest_ema``/``latest_z`` on it, and
    the latest ``latest_p50``/``latest_p99``/``latest_samples`` (recorded on the ``norm`` rows: the tail
    window's P50/P99, the count of judged requests).

    ``signal=None``: the node's **deciding** signal at its latest history write, the one the detector
    weighs, cuts and quarantines it on, as the tick stored it (``NodeHistory.deciding``, from the
    detector's ``Evaluation``); a node with no Z on any signal at that write shows its group's
    deciding signal (:func:`decision_signal`). Otherwise ``signal`` for every node.

    Correlated subqueries, each an index probe on ``(node, signal, at)`` (the deciding row: the rows of
    the node's latest ``norm`` write, which holds every signal): cost grows with the number of nodes,
    not with the length of their history."""
    tails = {f"latest_{f}": _latest("norm", f) for f in ("p50", "p99", "samples")}
    if signal is not None:
        return nodes.annotate(latest_signal=Value(signal, output_field=CharField()),
                              latest_ema=_latest(signal, "ema"), latest_z=_latest(signal, "z"), **tails)
    by_signal: dict[str, list[int]] = defaultdict(list)
    for group_id, stored in ModelGroup.objects.values_list("pk", "decision_signal"):
        by_signal[stored or "norm"].append(group_id)
    of_group = reduce(or_, (Q(node__group_id__in=ids, signal=s) for s, ids in by_signal.items()), Q(pk__in=[]))
    last_write = NodeHistory.objects.filter(node=OuterRef(OuterRef("pk")), signal="norm").order_by("-at")
    # The row the tick flagged, else (no Z on any signal) the group's deciding signal's row.
    deciding = (NodeHistory.objects.filter(node=OuterRef("pk"), at=Subquery(last_write.values("at")[:1]))
                .filter(Q(deciding=True) | of_group)
                .order_by("-deciding"))
    group_signal = Case(*(When(group_id__in=ids, then=Value(s)) for s, ids in by_signal.items()),
                        default=Value("norm"), output_field=CharField())
    return nodes.annotate(
        latest_signal=Coalesce(Subquery(deciding.values("signal")[:1]), group_signal),
        latest_ema=Subquery(deciding.values("ema")[:1]), latest_z=Subquery(deciding.values("z")[:1]), **tails)


def node_signal(node: Node) -> str:
    """``node``'s deciding signal now (see :func:`with_latest_figures`)."""
    return with_latest_figures(Node.objects.filter(pk=node.pk)).values_list("latest_signal", flat=True).get()


def latest_figures(node_ids: list[int], signal: str = "norm") -> dict[int, tuple]:
    """``{node_id: (ema, z, p50, p99, samples)}`` of each node's latest ``signal`` history row, in
    **one** query (nodes without history are absent).

    On PostgreSQL a ``LATERAL`` join probes the ``(node, signal, at)`` index once per node (1,000
    nodes: a few milliseconds, whatever the history length); elsewhere (SQLite demo) the same figures
    come from one correlated subquery per figure."""
    if not node_ids:
        return {}
    if connection.vendor != "postgresql":
        qs = Node.objects.filter(pk__in=node_ids).annotate(**{f"latest_{f}": _latest(signal, f) for f in LATEST_FIELDS})
        return {row[0]: tuple(row[1:]) for row in qs.values_list("pk", *(f"latest_{f}" for f in LATEST_FIELDS))
                if any(v is not None for v in row[1:])}
    table = NodeHistory._meta.db_table
    sql = (
        f"SELECT n.id, h.{', h.'.join(LATEST_FIELDS)} FROM unnest(%s::bigint[]) AS n(id) "
        f"CROSS JOIN LATERAL (SELECT {', '.join(LATEST_FIELDS)} FROM {table} "
        "WHERE node_id = n.id AND signal = %s ORDER BY at DESC LIMIT 1) AS h"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [list(node_ids), signal])
        return {row[0]: tuple(row[1:]) for row in cur.fetchall()}


#: Sort keys of the group page's nodes table (query parameter -> attribute of the node).
NODE_SORTS = {"attention": "attention", "name": "name", "state": "state", "weight": "weight", "z": "latest_z", "ema": "latest_ema",
              "p50": "latest_p50", "p99": "latest_p99", "samples": "latest_samples", "last_seen": "last_seen"}
#: Node columns the nodes table shows (the rest of the row is not read).
TABLE_COLUMNS = ("id", "group_id", "name", "address", "state", "weight", "base_weight", "last_seen", "gpu_evidence")


def group_nodes(group: ModelGroup, sort: str = "name", signal: str | None = "norm") -> list[Node]:
    """The group's live nodes with ``latest_signal``/``latest_ema``/``latest_z``/``latest_p50``/
    ``latest_p99``/``latest_samples`` set, sorted by ``sort`` (a :data:`NODE_SORTS` key, ``-`` prefix =
    descending, unknown keys sort by name; ``attention``: :data:`ATTENTION_ORDER`, then the highest Z).
    ``signal=None``: each node's Z and EMA on its **deciding** signal (:func:`with_latest_figures`,
    the API's node views; the heatmap's reading of the same write agrees with it).

    Two queries whatever the group size (nodes, then :func:`latest_figures`; one annotated query
    with ``signal=None``); sorted in Python,
    ties by name, nodes without the figure last, except in a descending sort (worst first) where
    the nodes without it that are not healthy or warming come **first**: a quarantined, probing or
    recovering node has no fresh Z because it gets no traffic, and it is the first one to look at."""
    live = group.nodes.filter(retired=False).only(*TABLE_COLUMNS)
    if signal is None:
        nodes = list(with_latest_figures(live))
    else:
        nodes = list(live)
        figures = latest_figures([n.pk for n in nodes], signal)
        empty = (None,) * len(LATEST_FIELDS)
        # P50/P99 are recorded on the norm rows only (the detector's tail window): read them there.
        tails = latest_figures([n.pk for n in nodes], "norm") if signal != "norm" else figures
        for n in nodes:
            n.latest_signal = signal
            for f, v in zip(LATEST_FIELDS, figures.get(n.pk, empty), strict=True):
                setattr(n, f"latest_{f}", v)
            tail = tails.get(n.pk, empty)
            n.latest_p50, n.latest_p99 = tail[LATEST_FIELDS.index("p50")], tail[LATEST_FIELDS.index("p99")]
    key = NODE_SORTS.get(sort.lstrip("-"), "name")
    if key == "attention":
        return by_attention(nodes)
    present = sorted((n for n in nodes if getattr(n, key) is not None), key=lambda n: n.name)
    # list.sort is stable also with reverse=True, so equal values keep the name order.
    present.sort(key=lambda n: getattr(n, key), reverse=sort.startswith("-"))
    missing = sorted((n for n in nodes if getattr(n, key) is None), key=lambda n: (attention_rank(n.state), n.name))
    if sort.startswith("-"):
        out = [n for n in missing if n.state not in _QUIET]
        return out + present + [n for n in missing if n.state in _QUIET]
    return present + missing


def by_attention(nodes: list[Node]) -> list[Node]:
    """``nodes`` (annotated by :func:`group_nodes`) in :data:`ATTENTION_ORDER`, then the highest
    Z first (a node without a Z before those with one), then by name."""
    return sorted(nodes, key=lambda n: (attention_rank(n.state),
                                        -(n.latest_z if n.latest_z is not None else math.inf), n.name))


SIGNAL_LABELS = {
    "decode": "decode time per output token (queue-free: what the detector decides on when TTFT is logged)",
    "norm": "normalised total latency (latency / the group's cost model)",
    "prefill": "time to first token / the group's prefill model (includes the queue)",
    "prefill_time": "prefill time without the queue / the group's prefill model (queue-free: from the model "
                    "server, or TTFT minus the logged queue time)",
}


def decision_signal(group: ModelGroup) -> str:
    """The signal the detector decided ``group`` on at its last tick, as the tick stored it
    (``ModelGroup.decision_signal``, from the ``Evaluation``): ``decode`` once the gateways log TTFT or
    the model servers stream, ``prefill_time`` from the servers' prefill histograms; ``norm`` without
    a queue-free signal, before the first tick and in seed mode (which judges each node on its own
    largest Z)."""
    return group.decision_signal or "norm"


def latest_baseline(group: ModelGroup, signal: str = "norm") -> GroupBaseline | None:
    """The detector's most recent stored peer baseline of ``group`` for ``signal`` (None before the
    first history write)."""
    return GroupBaseline.objects.filter(group=group, signal=signal).order_by("-at").first()


def state_counts(group_ids: list[int] | None = None) -> dict[int, Counter[str]]:
    """``{group_id: Counter(state -> live nodes)}`` (retired nodes excluded)."""
    qs = Node.objects.filter(retired=False)
    if group_ids is not None:
        qs = qs.filter(group_id__in=group_ids)
    out: dict[int, Counter[str]] = {}
    for gid, state in qs.values_list("group_id", "state"):
        out.setdefault(gid, Counter())[state] += 1
    return out


def safeguard_status(group: ModelGroup, counts: Counter[str]) -> dict[str, Any]:
    """The safeguard as the group's last tick left it (:meth:`ModelGroup.safeguard`, the detector's
    :class:`~detector.states.Safeguard`): ``out`` nodes counted against it (out of service or
    pending approval: :data:`~detector.states.SAFEGUARD_COUNTED`) of ``total``, its ``limit``, ``held``
    nodes it kept in service this tick, and ``engaged``. Before the first tick: ``limit`` None, not
    engaged."""
    stored = group.safeguard()
    fraction = group.thresholds().max_quarantine_fraction
    total = sum(counts.values())
    if stored is None:
        return {"out": 0, "total": total, "limit": None, "held": 0, "fraction": fraction, "engaged": False}
    return {"out": stored.counted, "total": total, "limit": stored.limit, "held": stored.held,
            "fraction": fraction, "engaged": stored.engaged}


def pending_proposals() -> QuerySet[QuarantineProposal]:
    return QuarantineProposal.objects.filter(status="pending").select_related("node", "group")
