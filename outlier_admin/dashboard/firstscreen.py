"""The overview's first screen, for the on-call engineer woken at 3 a.m.: what is wrong *now*.

Every live node that is not ``healthy``, most urgent first (:data:`outlier_admin.history.queries.ATTENTION_ORDER`,
then the highest Z), each with its state, since when and why: for a node in an incident
(:mod:`outlier_admin.control.incidents`) the incident's start and its deciding cause (signal, Z, EMA
vs peer baseline with units), which the canary's cycles do not move, with its latest probe beneath
("3 probes failed, last 11 s ago: 2.70x expected, limit 1.50x expected"); its weight, and whether the
group's gateways have applied the weights that say so: the agents
report the version they applied (:meth:`agent.client.GatewayClient.report_applied`,
hash ``outlier:applied:<group>``), and a published version that no gateway applied is a control loop
that is not closed. Three queries whatever the fleet size, plus one Redis round trip.

Below it, **every operator override in force** (:func:`overrides_in_force`): pinned weights, forced
states and silenced proposals, each with who set it, why and until when. A pin on a node the detector
calls healthy is otherwise invisible here, and a forgotten pin (or a forced-active node that is slow
again) is exactly what the on-call engineer must see at 3 a.m. Four more queries.

Then **the incidents that ended in the last hour** with their outcome — one that ended without a probe
finding the node slow reads "cut and restored: no fault found" — and, in the demo, **the faults it
injected** (:func:`injected_faults`), so a newcomer tells them from the detector's own calls.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
import redis
from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from contract import keys
from detector.signals import unit_of
from detector.states import NodeState as S
from detector.thresholds import Thresholds
from outlier_admin.control.incidents import cause_in_words, cause_text, probe_summary
from outlier_admin.control.models import (
    AuditEvent,
    CanaryProbe,
    Incident,
    Outcome,
    Override,
    OverrideKind,
    QuarantineProposal,
    Silence,
    Transition,
)
from outlier_admin.control.redis_conn import get_redis
from outlier_admin.dashboard.tables import STATE_ICONS
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.history.queries import attention_rank
from outlier_admin.observability.alerts import held_degraded_since

log = logging.getLogger(__name__)

#: At most this many rows (the rest is counted, and on the group pages): a fleet-wide incident must
#: not make the first screen itself slow.
MAX_PROBLEMS = 200

@dataclass(frozen=True)
class GatewayReport:
    """What one gateway said it applied (``behind``: versions behind the published one). ``gone``: no
    report for ``GATEWAY_GONE_AFTER_S`` (a running agent reports at every resync, 30 s): an agent
    run once (``--once``) or stopped, not a gateway left behind; it is not counted as behind."""

    gateway: str
    version: int
    applied_at: datetime
    mode: str
    behind: int
    gone: bool = False


@dataclass
class GroupGateways:
    """The published version of a group and what its gateways applied (``None``: Redis unreachable)."""

    published: int
    reports: list[GatewayReport] | None

    @property
    def oldest(self) -> int | None:
        return min((r.version for r in self.reports), default=None) if self.reports else None

    @property
    def summary(self) -> str:
        if self.reports is None:
            return "unknown (Redis unreachable)"
        if not self.reports:
            return f"no gateway has reported (published v{self.published})"
        live = [r for r in self.reports if not r.gone]
        gone = len(self.reports) - len(live)
        quiet = f"; {gone} gone (no report for {settings.GATEWAY_GONE_AFTER_S} s)" if gone else ""
        if not live:
            return f"no gateway reporting (published v{self.published}){quiet}"
        behind = [r for r in live if r.behind > 0]
        if not behind:
            return f"v{self.published} on all {len(live)} gateway(s){quiet}"
        oldest = min(r.version for r in live)
        return (f"v{oldest} on the oldest of {len(live)} gateway(s); published v{self.published} "
                f"({len(behind)} gateway(s) behind){quiet}")


@dataclass(frozen=True)
class Problem:
    node: Node
    icon: str
    since: datetime | None
    cause: str
    detail: str
    z: float | None
    gateways: GroupGateways
    #: Held degraded past its group's ``degraded_alert_s`` (:func:`~outlier_admin.observability.alerts.
    #: held_degraded_since`, the rule of the ``OutlierNodeHardwareCheck`` alert): "needs hardware check".
    hardware_check: bool = False
    #: The node's open incident: ``since`` is its start and ``cause`` its deciding cause, whatever the
    #: canary did since; ``detail`` is then its probes in one line.
    incident: Incident | None = None
    #: An injected fault of the demo on this node (:func:`injected_faults`), in words.
    injected: str = ""


@dataclass(frozen=True)
class InjectedFault:
    """A fault the demo injected (its audit event ``demo.fault``): which node, what, when."""

    group: str
    node: str
    node_pk: int | None
    kind: str
    starts_at: datetime
    ends_at: datetime

    def words(self) -> str:
        return f"{self.kind.replace('_', ' ')} injected {self.starts_at:%H:%M:%S}–{self.ends_at:%H:%M:%S} UTC"

    def covers(self, at: datetime | None) -> bool:
        return at is not None and self.starts_at <= at <= self.ends_at


@dataclass(frozen=True)
class OverrideInForce:
    """One operator decision that still overrides the detector: ``what`` in words, who, why, since
    when and until when (``until`` ``None``: until an operator undoes it)."""

    node: Node
    kind: str  # "pin", "forced_quarantine", "forced_active", "silence"
    what: str
    actor: str
    reason: str
    since: datetime
    until: datetime | None


@dataclass
class FirstScreen:
    problems: list[Problem] = field(default_factory=list)  # warming nodes last, see ``urgent``
    more: int = 0  # problems beyond MAX_PROBLEMS
    live_nodes: int = 0
    gateways: dict[str, GroupGateways] = field(default_factory=dict)  # group name -> report
    overrides: list[OverrideInForce] = field(default_factory=list)
    #: Incidents that ended in the last :data:`ENDED_WINDOW_S`, newest first, with their outcome.
    ended: list[Incident] = field(default_factory=list)
    #: The demo's injected faults (empty outside the demo): a newcomer tells them from a false cut.
    injected: list[InjectedFault] = field(default_factory=list)

    @property
    def urgent(self) -> list[Problem]:
        return [p for p in self.problems if p.node.state != S.WARMING.label]

    @property
    def warming(self) -> list[Problem]:
        return [p for p in self.problems if p.node.state == S.WARMING.label]


def applied_versions(groups: list[ModelGroup], now: float | None = None) -> dict[str, GroupGateways]:
    """``{group name: GroupGateways}`` from the agents' reports (one Redis pipeline). Malformed
    report fields are skipped: the hash is written by gateway hosts, so it is untrusted input."""
    now = time.time() if now is None else now
    try:
        pipe = get_redis().pipeline(transaction=False)
        for g in groups:
            pipe.hgetall(keys.applied(g.name))
        raw = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        log.warning("cannot read the applied versions: %s", exc)
        return {g.name: GroupGateways(g.weights_version, None) for g in groups}
    out = {}
    for g, fields in zip(groups, raw, strict=True):
        reports = []
        for gw, body in sorted(fields.items()):
            try:
                d = orjson.loads(body)
                version, at = int(d["version"]), float(d["applied_at"])
                applied = datetime.fromtimestamp(min(at, now), tz=UTC)
            except (ValueError, TypeError, KeyError, OverflowError, OSError):
                continue
            reports.append(GatewayReport(gw.decode(errors="replace")[:200], version, applied, str(d.get("mode", ""))[:20],
                                         max(0, g.weights_version - version),
                                         gone=now - at > settings.GATEWAY_GONE_AFTER_S))
        out[g.name] = GroupGateways(g.weights_version, reports)
    return out


#: The override kinds that set a node's forced state, and the state each one sets.
FORCING = {OverrideKind.QUARANTINE: S.FORCED_QUARANTINE.label, OverrideKind.ACTIVATE: S.FORCED_ACTIVE.label}


def _latest_override(kinds: list[str]) -> Subquery:
    """The newest override of ``kinds`` of the outer node that a tick did not refuse."""
    return Subquery(Override.objects.filter(node=OuterRef("pk"), kind__in=kinds)
                    .exclude(outcome=Outcome.FAILED).order_by("-created_at", "-pk").values("pk")[:1])


def overrides_in_force(now: datetime | None = None) -> list[OverrideInForce]:
    """Every operator override that still holds on a live node (module docstring), newest first.

    - a **pin**: the node's newest pin/unpin is a pin, not refused by the tick and not expired (the
      detector drops a pin at its expiry);
    - a **forced state**: the node is ``forced_quarantine`` / ``forced_active`` now, with the newest
      override that forced it (who, why, its expiry);
    - a **silence**: no new quarantine proposal of that cause until it ends (:class:`Silence`)."""
    now = now or timezone.now()
    pins = (Node.objects.filter(retired=False)
            .annotate(last_pin=_latest_override([OverrideKind.PIN, OverrideKind.UNPIN]))
            .exclude(last_pin=None).values_list("last_pin", flat=True))
    forced = (Node.objects.filter(retired=False, state__in=list(FORCING.values()))
              .annotate(last_force=_latest_override(list(FORCING)))
              .exclude(last_force=None).values_list("last_force", flat=True))
    rows = Override.objects.filter(pk__in=[*pins, *forced]).select_related("node", "node__group")
    out = []
    for o in rows:
        if o.expires_at is not None and o.expires_at <= now:
            continue
        if o.kind == OverrideKind.PIN:
            out.append(OverrideInForce(o.node, "pin", f"weight pinned at {o.weight}/{o.node.base_weight}",
                                       o.actor, o.reason, o.created_at, o.expires_at))
        elif o.kind in FORCING and o.node.state == FORCING[o.kind]:
            what = "forced out of service" if o.kind == OverrideKind.QUARANTINE else "forced into service (not judged)"
            out.append(OverrideInForce(o.node, FORCING[o.kind], what, o.actor, o.reason, o.created_at,
                                       o.expires_at))
    for si in Silence.objects.active(now).filter(node__retired=False).select_related("node", "node__group"):
        out.append(OverrideInForce(si.node, "silence", f"no new {si.get_cause_display()} quarantine proposal",
                                   si.actor, si.reason, si.created_at, si.expires_at))
    out.sort(key=lambda o: o.since, reverse=True)
    return out


#: How far back the first screen lists incidents that ended (a false cut an hour ago still explains a
#: page the operator is reading now).
ENDED_WINDOW_S = 3600
ENDED_MAX = 20


def injected_faults() -> list[InjectedFault]:
    """The faults the demo injected, from its audit events ``demo.fault`` (``detail``: kind, start and
    end as epoch seconds); none outside the demo. A fault the demo healed early (``demo.heal``, after
    ``DEMO_HEAL_AFTER_PROBES`` failed probes) ends at its heal. Malformed details are skipped."""
    out = []
    recent = timezone.now() - timedelta(days=1)  # an earlier run's faults (a kept database) are not these
    heals: dict[tuple[int | None, str], list[float]] = {}
    for a in AuditEvent.objects.filter(action="demo.heal", at__gte=recent).order_by("-at")[:20]:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            heals.setdefault((a.node_id, str(a.detail["kind"])), []).append(float(a.detail["healed_at"]))
    for a in (AuditEvent.objects.filter(action="demo.fault", at__gte=recent).select_related("group", "node")
              .order_by("-at")[:20]):
        d = a.detail or {}
        try:
            start_s = float(d["starts_at"])
            healed = [h for h in heals.get((a.node_id, str(d.get("kind", "fault"))), []) if h >= start_s]
            start = datetime.fromtimestamp(start_s, UTC)
            end = datetime.fromtimestamp(min([float(d["ends_at"]), *healed]), UTC)
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            continue
        out.append(InjectedFault(a.group.name if a.group else "", a.node.name if a.node else str(d.get("node", "")),
                                 a.node_id, str(d.get("kind", "fault"))[:40], start, end))
    return sorted(out, key=lambda f: f.starts_at)


def mark_injected(incidents: list[Incident], faults: list[InjectedFault]) -> None:
    """Set ``injected`` on each incident (the demo's fault on its node at its start, in words, or "")."""
    for inc in incidents:
        inc.injected = _injected_on(faults, inc.node, inc.started_at)


def _injected_on(faults: list[InjectedFault], node: Node, at: datetime | None) -> str:
    hit = next((f for f in faults if f.node_pk == node.pk and f.covers(at)), None)
    return hit.words() if hit else ""


def _forced_by(overrides: list[OverrideInForce], node: Node) -> OverrideInForce | None:
    return next((o for o in overrides if o.node.pk == node.pk and o.kind == node.state), None)


def first_screen(gateways: dict[str, GroupGateways] | None = None, now: float | None = None) -> FirstScreen:
    """Every live node that is not healthy, most urgent first, with the evidence for each (see the
    module docstring); ``gateways``: :func:`applied_versions` already read for (at least) their groups."""
    latest = Transition.objects.filter(node=OuterRef("pk")).order_by("-at")
    nodes = list(
        Node.objects.filter(retired=False).exclude(state=S.HEALTHY.label).select_related("group")
        .annotate(last_transition=Subquery(latest.values("pk")[:1]))
    )
    screen = FirstScreen(live_nodes=Node.objects.filter(retired=False).count())
    groups = {n.group_id: n.group for n in nodes}
    missing = [g for g in groups.values() if gateways is None or g.name not in gateways]
    screen.gateways = {**(gateways or {}), **applied_versions(missing, now)} if missing else dict(gateways or {})
    transitions = Transition.objects.in_bulk([n.last_transition for n in nodes if n.last_transition])
    pending = {p.node_id: p for p in QuarantineProposal.objects.filter(
        status="pending", node__in=[n.pk for n in nodes])}
    incidents = {i.node_id: i for i in Incident.objects.filter(node__in=[n.pk for n in nodes], ended_at__isnull=True)}
    probes: dict[int, list[CanaryProbe]] = {}
    if incidents:
        since_first = min(i.started_at for i in incidents.values())
        for pr in CanaryProbe.objects.filter(node_id__in=list(incidents), at__gte=since_first).order_by("-at")[:2000]:
            if pr.at >= incidents[pr.node_id].started_at:
                probes.setdefault(pr.node_id, []).append(pr)
    screen.overrides = overrides_in_force()
    screen.injected = injected_faults()
    at = datetime.fromtimestamp(now, UTC) if now is not None else timezone.now()
    screen.ended = list(Incident.objects.filter(ended_at__gte=at - timedelta(seconds=ENDED_WINDOW_S))
                        .select_related("node", "group").order_by("-ended_at")[:ENDED_MAX])
    mark_injected(screen.ended, screen.injected)
    cache: dict[int, Thresholds] = {}

    def thresholds_of(group: ModelGroup) -> Thresholds:
        if group.pk not in cache:
            cache[group.pk] = group.thresholds()
        return cache[group.pk]

    rows = []
    for n in nodes:
        t = transitions.get(n.last_transition)
        current = t is not None and t.to_state == n.state
        forced = _forced_by(screen.overrides, n)
        inc = incidents.get(n.pk)
        z = t.z if current and forced is None else None
        if forced is not None:  # who, why and until when, not only "by an operator"
            until = f"until {forced.until:%Y-%m-%d %H:%M} UTC" if forced.until else "until released"
            cause = f"{forced.what} by {forced.actor}"
            detail, since = f"{forced.reason} ({until})", forced.since
        elif inc is not None:
            # The incident's start and deciding cause, whatever the canary did since; its probes beneath.
            since, z = inc.started_at, inc.z
            cause = cause_text(inc)
            if n.state == S.PENDING_APPROVAL.label and n.pk in pending:
                cause = f"waiting for approval: {cause}"
            detail = probe_summary(probes.get(n.pk, []), at, unit_of("norm", thresholds_of(n.group).normalization))
        elif n.state == S.PENDING_APPROVAL.label and n.pk in pending:
            p = pending[n.pk]
            cause, detail, since = f"waiting for approval: {p.reason}", "", p.created_at
        elif current:
            cause, detail, since = cause_in_words(t.reason, t.signal), t.explanation.get("detail", ""), t.at
        elif n.state == S.WARMING.label:
            cause, detail, since = "new or restarted: warming up before it is judged", "", n.registered_at
        else:
            cause, detail, since = "no transition recorded into this state", "", None
        check = held_degraded_since(n.state, since, thresholds_of(n.group).degraded_alert_s, at) if (
            current or inc is not None) else False
        rows.append(Problem(n, STATE_ICONS.get(n.state, "○"), since, cause, detail, z,
                            screen.gateways[n.group.name], check, inc, _injected_on(screen.injected, n, since)))
    rows.sort(key=lambda r: (attention_rank(r.node.state), -(r.z if r.z is not None else float("inf")),
                             r.node.group.name, r.node.name))
    screen.problems, screen.more = rows[:MAX_PROBLEMS], max(0, len(rows) - MAX_PROBLEMS)
    return screen
