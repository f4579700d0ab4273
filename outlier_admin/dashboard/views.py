"""Dashboard pages. Thin: check the role, read through :mod:`outlier_admin.history.queries`, change through
:mod:`outlier_admin.control.actions` (which validates and audits), render a template.

Roles (:mod:`outlier_admin.fleet.roles`): every page needs a role; anonymous users go to the
login page, users without the capability get a 403 page that says which role they need.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from detector.signals import SIGNALS, unit_of
from detector.states import CANARY_STATES
from detector.thresholds import ThresholdError
from outlier_admin.control import actions
from outlier_admin.control.incidents import CANARY_CYCLE
from outlier_admin.control.incidents import story as incident_story
from outlier_admin.control.models import (
    AuditEvent,
    CanaryProbe,
    Incident,
    NodeHistory,
    Override,
    QuarantineProposal,
    Silence,
    Transition,
)
from outlier_admin.dashboard.charts import node_charts, signal_unit
from outlier_admin.dashboard.firstscreen import applied_versions, first_screen, injected_faults, mark_injected
from outlier_admin.dashboard.forms import (
    OverrideForm,
    PolicyForm,
    ProposalDecisionForm,
    ReasonForm,
    RetireForm,
    ThresholdForm,
)
from outlier_admin.dashboard.heatmap import MAX_ROWS as HEATMAP_ROWS
from outlier_admin.dashboard.heatmap import STATE_COLORS as HEATMAP_STATES
from outlier_admin.dashboard.heatmap import data_window, first_write, heatmap, heatmap_legend
from outlier_admin.dashboard.tables import node_rows
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.fleet.roles import CAPABILITIES, capabilities_of, may_preview, preview_roles, user_can
from outlier_admin.history import queries
from outlier_admin.history.audit import fold
from outlier_admin.history.filters import AuditFilter, RejectedInputFilter, TransitionFilter
from outlier_admin.history.preview import (
    PreviewThrottled,
    PreviewTooLarge,
    preview_thresholds,
)
from outlier_admin.history.timeline import RangeError, group_baseline, node_timeline, parse_range
from outlier_admin.ingest.models import GpuReading, RejectedInput

SORTS = queries.NODE_SORTS
#: Rows per page of the group page's nodes table. The table is sorted over the whole group first;
#: the page's budget is 300 ms on a shared machine and rendering 1,000 rows takes about a third of
#: it, 200 rows ~25 ms (``bench/dashboard.py``).
GROUP_PAGE_SIZE = 200


def requires(capability: str) -> Callable:
    """View decorator: login (redirect) and ``capability`` (403 page naming the role needed)."""

    def deco(view: Callable) -> Callable:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not user_can(request.user, capability):
                return render(request, "dashboard/forbidden.html",
                              {"capability": capability, "roles": sorted(CAPABILITIES[capability])}, status=403)
            return view(request, *args, **kwargs)

        return wrapped

    return deco


def _ctx(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {"can": capabilities_of(request.user), "pending_count": queries.pending_proposals().count(), **extra}


@requires("read")
def overview(request: HttpRequest) -> HttpResponse:
    """The first screen (:mod:`outlier_admin.dashboard.firstscreen`: every node that is not healthy,
    first), the groups with their gateways' applied versions, then the recent transitions."""
    groups = list(ModelGroup.objects.filter(retired=False))
    counts = queries.state_counts([g.pk for g in groups])
    gateways = applied_versions(groups)
    rows = []
    for g in groups:
        c = counts.get(g.pk, {})
        rows.append({"group": g, "counts": [(s, c.get(s, 0)) for s in queries.STATE_ORDER],
                     "total": sum(c.values()), "safeguard": queries.safeguard_status(g, c),
                     "gateways": gateways[g.name]})
    recent = Transition.objects.select_related("node", "group")[:25]
    return render(request, "dashboard/overview.html", _ctx(
        request, rows=rows, states=queries.STATE_ORDER, recent=recent, screen=first_screen(gateways),
        pending=queries.pending_proposals()[:10],
    ))


@requires("read")
def group_page(request: HttpRequest, slug: str) -> HttpResponse:
    """Nodes table (sorted over the whole group, then paginated; by default problems first), the
    heatmap of Z over the last hour (:mod:`outlier_admin.dashboard.heatmap`), the detector's stored
    baseline, safeguard and thresholds. ``?partial=nodes`` / ``?partial=heatmap`` return only the
    table / the heatmap (the page's live refresh)."""
    group = get_object_or_404(ModelGroup, slug=slug)
    if request.GET.get("partial") == "heatmap":
        return render(request, "dashboard/_heatmap.html", _heatmap_ctx(group, _asked_signal(request)))
    sort = request.GET.get("sort", "attention")
    if sort.lstrip("-") not in SORTS:
        sort = "attention"
    signal = _signal(request, group)
    # Without ?signal=, each node's Z on its deciding signal: the API's, and the heatmap's.
    ordered = queries.group_nodes(group, sort, signal=_asked_signal(request))
    page = Paginator(ordered, GROUP_PAGE_SIZE).get_page(request.GET.get("page"))
    counts = queries.state_counts([group.pk]).get(group.pk, {})
    ctx = _ctx(request, group=group, nodes=node_rows(page.object_list, group.thresholds()), page=page, sort=sort,
               signal=signal, signal_asked=_asked_signal(request), signal_label=queries.SIGNAL_LABELS[signal],
               signals=SIGNALS,
               ema_unit=signal_unit(signal, group.thresholds()),
               baseline=queries.latest_baseline(group, signal),
               safeguard=queries.safeguard_status(group, counts), thresholds=group.thresholds().to_dict(),
               counts=[(s, counts.get(s, 0)) for s in queries.STATE_ORDER if counts.get(s)])
    if request.GET.get("partial") == "nodes":
        return render(request, "dashboard/_nodes_table.html", ctx)
    return render(request, "dashboard/group.html",
                  {**ctx, **_heatmap_ctx(group, _asked_signal(request), queries.by_attention(ordered))})


def _heatmap_ctx(group: ModelGroup, asked: str | None, nodes: list[Node] | None = None) -> dict[str, Any]:
    """The heatmap's rows are the group's nodes in attention order (``nodes``: already so sorted).
    Read on ``asked`` (``?signal=``), else on each node's deciding signal: the group's judged signals
    (:func:`~outlier_admin.history.queries.judged_signals`), of which the detector takes the larger Z."""
    now = timezone.now()
    window = data_window(now, first_write(group.pk, now - timedelta(hours=1)), settings.HISTORY_EVERY_S)
    signals = (asked,) if asked else queries.judged_signals(ModelGroup.objects.filter(pk=group.pk))[group.pk]
    nodes = queries.group_nodes(group, "attention", signal=asked) if nodes is None else nodes
    t = group.thresholds()
    return {"group": group, "heatmap_signal": asked, "heatmap_signals": signals,
            "heatmap_start": window.start, "heatmap_end": window.end, "heatmap_step_s": window.step_s,
            "heatmap_rows": min(len(nodes), HEATMAP_ROWS), "heatmap_nodes": len(nodes),
            "heatmap": heatmap(nodes, t, window=window, signals=signals, signal=asked),
            "heatmap_states": HEATMAP_STATES, "heatmap_legend": heatmap_legend(t)}


def _asked_signal(request: HttpRequest) -> str | None:
    """``?signal=`` when it names a signal, else None."""
    asked = request.GET.get("signal")
    return asked if asked in SIGNALS else None


def _signal(request: HttpRequest, group: ModelGroup) -> str:
    """``?signal=`` if valid, else the signal the detector decides on for the group."""
    return _asked_signal(request) or queries.decision_signal(group)


@requires("read")
def node_page(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("group"), pk=pk)
    try:
        start, end = parse_range(request.GET, now=timezone.now(), default_hours=1.0)
    except RangeError as exc:
        messages.error(request, str(exc))
        start, end = timezone.now() - timedelta(hours=1), timezone.now()
    if "hours" not in request.GET and "start" not in request.GET:
        # A young node (new, or just restarted demo): start the default view at its first record so
        # its charts are not squeezed into the right edge of an hour.
        first = NodeHistory.objects.filter(node=node, at__gte=start).order_by("at").values_list("at", flat=True).first()
        if first is not None and end - first >= timedelta(minutes=1):
            start = first
        elif first is not None:
            start = max(start, end - timedelta(minutes=5))
    # By default the signal the detector judged this node on at its latest write, as the API does.
    signal = _asked_signal(request) or queries.node_signal(node)
    points = node_timeline(node, start, end, signal=signal)
    # P50/P99 come from the detector's tail window, recorded on the norm rows.
    tail_points = points if signal == "norm" else node_timeline(node, start, end)
    # The evidence that gates a weight cut is recorded on the rows of the signal the detector decides on.
    decision = queries.decision_signal(node.group)
    evidence_points = (points if signal == decision else
                       tail_points if decision == "norm" else node_timeline(node, start, end, signal=decision))
    transitions = list(Transition.objects.filter(node=node, at__gte=start, at__lt=end).order_by("at"))
    baseline = group_baseline(node.group_id, start, end, signal=signal)
    # Canary probes are judged on the norm scale: their Z is read against the norm baseline.
    norm_baseline = baseline if signal == "norm" else group_baseline(node.group_id, start, end, signal="norm")
    chart_probes = list(CanaryProbe.objects.filter(node=node, at__gte=start, at__lt=end).order_by("-at")[:2000])
    charts = node_charts(points, baseline, transitions,
                         node.group.thresholds(), start, end, signal=signal, tail_points=tail_points,
                         evidence_points=evidence_points, probes=chart_probes, norm_baseline=norm_baseline)
    # The model-server and DCGM scrapes' failures of the last day, newest 5 (one kept per kind a minute
    # by the scraper, per kind and REJECT_EVERY_S by the DCGM round).
    scrape_failures = RejectedInput.objects.filter(
        source__in=[f"{kind}:{node.group.name}/{node.name}"[:100] for kind in ("metrics", "dcgm")],
        reason="scrape_failed", received_at__gte=timezone.now() - timedelta(days=1)).order_by("-received_at")[:5]
    latest_gpu: dict[str, GpuReading] = {}
    for r in GpuReading.objects.filter(node=node).order_by("-at")[:64]:
        latest_gpu.setdefault(r.gpu, r)
    # The page opens on the node's incident (the open one, else the latest): its start, its deciding
    # cause, then what happened beneath it, the canary's probes folded.
    incidents = list(Incident.objects.filter(node=node).select_related("group", "node")[:20])
    current = next((i for i in incidents if i.is_open), incidents[0] if incidents else None)
    mark_injected(incidents, injected_faults())  # the demo's own faults, told from the detector's calls
    # The transitions below, without the canary's cycles (each one a probe outcome, in the probes table).
    recent = list(Transition.objects.filter(node=node)[:200])
    told = [t for t in recent if t.reason not in CANARY_CYCLE][:50]
    return render(request, "dashboard/node.html", _ctx(
        request, node=node, charts=charts, start=start, end=end, hours=request.GET.get("hours", "1"),
        signal=signal, signals=SIGNALS, signal_label=queries.SIGNAL_LABELS[signal],
        decision_signal=decision, points=len(points), transitions=told, cycles=len(recent) - len(told) if len(recent) < 200 else None,
        story=incident_story(current) if current else None, incidents=incidents,
        probe_unit=unit_of("norm", node.group.thresholds().normalization),
        probes=CanaryProbe.objects.filter(node=node)[:50], overrides=Override.objects.filter(node=node).select_related("transition")[:50],
        gpus=sorted(latest_gpu.values(), key=lambda r: r.gpu), override_form=OverrideForm(),
        scrape_failures=list(scrape_failures),
    ))


@requires("override")
@require_http_methods(["GET", "POST"])
def node_override(request: HttpRequest, pk: int) -> HttpResponse:
    """Two steps: the form posts without ``confirmed`` and gets a confirmation page that restates
    the action; only the confirmation's POST (``confirmed=True``) calls the action."""
    node = get_object_or_404(Node.objects.select_related("group"), pk=pk)
    form = OverrideForm(request.POST or None, node=node, initial={"action": request.GET.get("action", "quarantine")})
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        if not d["confirmed"]:
            confirm = OverrideForm(node=node, initial={**d, "confirmed": True})
            return render(request, "dashboard/override_confirm.html", _ctx(request, node=node, form=confirm, data=d))
        try:
            if d["action"] == "quarantine":
                actions.do_quarantine(node, actor=request.user, reason=d["reason"], expires_in_s=d["expires_in_s"])
            elif d["action"] == "activate":
                actions.do_activate(node, actor=request.user, reason=d["reason"], expires_in_s=d["expires_in_s"])
            elif d["action"] == "pin":
                actions.do_pin_weight(node, d["weight"], actor=request.user, reason=d["reason"],
                                      expires_in_s=d["expires_in_s"])
            elif d["action"] == "unpin":
                actions.do_unpin_weight(node, actor=request.user, reason=d["reason"])
            else:
                actions.do_release(node, actor=request.user, reason=d["reason"])
        except actions.ActionError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"{d['action']} of {node.name} recorded; it takes effect at the group's next tick.")
            return redirect("dashboard:node", pk=node.pk)
    return render(request, "dashboard/override.html", _ctx(request, node=node, form=form),
                  status=400 if request.method == "POST" else 200)


@requires("override")
@require_http_methods(["GET", "POST"])
def node_retire(request: HttpRequest, pk: int) -> HttpResponse:
    """Two steps like an override: the form (a reason), then a confirmation restating that the node
    leaves the group's weights at the next tick; only the confirmed POST calls the action."""
    node = get_object_or_404(Node.objects.select_related("group"), pk=pk)
    form = RetireForm(request.POST or None)
    confirm = None
    if request.method == "POST" and form.is_valid():
        if not form.cleaned_data["confirmed"]:
            confirm = RetireForm(initial={"reason": form.cleaned_data["reason"], "confirmed": True})
        else:
            try:
                actions.do_retire_node(node, actor=request.user, reason=form.cleaned_data["reason"])
            except actions.ActionError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"{node.name} retired: it leaves the weights of {node.group.name} "
                                          "at the group's next tick.")
                return redirect("dashboard:group", slug=node.group.slug)
    status = 400 if request.method == "POST" and form.errors else 200
    return render(request, "dashboard/retire.html", _ctx(request, node=node, form=confirm or form,
                                                          confirming=confirm is not None), status=status)


@requires("read")
def approvals(request: HttpRequest) -> HttpResponse:
    decided = QuarantineProposal.objects.exclude(status="pending").select_related("node", "group", "transition")[:25]
    silences = Silence.objects.active().select_related("node", "node__group").order_by("expires_at")[:200]
    return render(request, "dashboard/approvals.html", _ctx(
        request, pending=queries.pending_proposals(), decided=decided, form=ProposalDecisionForm(),
        silences=silences))


@requires("decide")
@require_http_methods(["POST"])
def decide_proposal(request: HttpRequest, pk: int) -> HttpResponse:
    proposal = get_object_or_404(QuarantineProposal, pk=pk)
    form = ProposalDecisionForm(request.POST)
    if form.is_valid():
        d = form.cleaned_data
        try:
            if d["decision"] == "approve":
                actions.do_approve_proposal(proposal, actor=request.user, reason=d["reason"])
            else:
                actions.do_reject_proposal(proposal, actor=request.user, reason=d["reason"],
                                           silence_s=d["silence_s"] or actions.DEFAULT_SILENCE_S)
        except actions.ActionError as exc:
            messages.error(request, str(exc))
        else:
            done = "approved" if d["decision"] == "approve" else "rejected"
            messages.success(request, f"Proposal {proposal.pk} for {proposal.node.name}: {done}.")
    else:
        messages.error(request, "A reason is required to approve or reject a proposal.")
    return redirect("dashboard:approvals")


@requires("decide")
@require_http_methods(["POST"])
def expire_silence(request: HttpRequest, pk: int) -> HttpResponse:
    """End a silence now (role ``operator``, like the rejection that started it)."""
    silence = get_object_or_404(Silence, pk=pk)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A reason is required to expire a silence.")
    else:
        try:
            actions.do_expire_silence(silence, actor=request.user, reason=form.cleaned_data["reason"])
        except actions.ActionError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Silence {silence.pk} for {silence.node.name} expired.")
    return redirect("dashboard:approvals")


@requires("read")
@require_http_methods(["GET", "POST"])
def thresholds_page(request: HttpRequest, slug: str) -> HttpResponse:
    """Preview (``operator`` or ``oncall``: :func:`~outlier_admin.history.preview.may_preview`) and save
    (``operator``). Preview replays the last hour of history, within the preview's bounds."""
    group = get_object_or_404(ModelGroup, slug=slug)
    form = ThresholdForm(request.POST or None, current=group.thresholds())
    preview = None
    status = 200
    if request.method == "POST" and "save" not in request.POST and not may_preview(request.user):
        return render(request, "dashboard/forbidden.html",
                      {"capability": "preview thresholds", "roles": preview_roles()}, status=403)
    if request.method == "POST" and form.is_valid():
        changes = form.changes()
        save = "save" in request.POST
        if save and not user_can(request.user, "tune"):
            return render(request, "dashboard/forbidden.html",
                          {"capability": "tune", "roles": sorted(CAPABILITIES["tune"])}, status=403)
        if not changes:
            form.add_error(None, "No value differs from the current thresholds.")
        elif save and not form.cleaned_data.get("reason", "").strip():
            form.add_error("reason", "A reason is required to save (it goes into the audit log).")
        else:
            try:
                if save:
                    change = actions.do_update_thresholds(group, changes, actor=request.user,
                                                          reason=form.cleaned_data["reason"])
                    messages.success(request, f"Thresholds version {change.version} saved.")
                    return redirect("dashboard:thresholds", slug=group.slug)
                preview = preview_thresholds(group, changes, user=request.user)  # the API's limit, same bucket
            except PreviewThrottled as exc:
                form.add_error(None, str(exc))
                status = exc.status
            except ThresholdError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            except (actions.ActionError, PreviewTooLarge) as exc:
                form.add_error(None, str(exc))
    if request.method == "POST" and form.errors and status == 200:
        status = 400
    return render(request, "dashboard/thresholds.html", _ctx(
        request, group=group, form=form, preview=preview, can_preview=may_preview(request.user),
        policy_form=PolicyForm(initial={"policy": group.policy}),
        history=group.threshold_changes.all()[:50],
    ), status=status)


@requires("tune")
@require_http_methods(["POST"])
def group_policy(request: HttpRequest, slug: str) -> HttpResponse:
    group = get_object_or_404(ModelGroup, slug=slug)
    form = PolicyForm(request.POST)
    if form.is_valid():
        try:
            actions.do_set_group_policy(group, form.cleaned_data["policy"], actor=request.user,
                                        reason=form.cleaned_data["reason"])
            messages.success(request, f"Policy of {group.name} is now {form.cleaned_data['policy']}.")
        except actions.ActionError as exc:
            messages.error(request, str(exc))
    else:
        messages.error(request, "Choose a policy and give a reason.")
    return redirect("dashboard:thresholds", slug=group.slug)


#: The canary review keeps a recovered node's probes and restore steps on the page this long: the
#: review is most often read after the fact ("why did it come back?"), when the node is healthy again.
CANARY_HISTORY = timedelta(hours=24)
CANARY_HISTORY_NODES = 20


def _canary_rows(nodes: list[Node]) -> list[dict[str, Any]]:
    """Each node's last 10 probes and restore steps (two queries for all of them)."""
    probes: dict[int, list[CanaryProbe]] = {n.pk: [] for n in nodes}
    for p in CanaryProbe.objects.filter(node__in=nodes).order_by("-at")[:20 * max(len(nodes), 1)]:
        if len(probes[p.node_id]) < 10:
            probes[p.node_id].append(p)
    steps = Transition.objects.filter(node__in=nodes, reason__in=(
        "probes_passed", "probe_failed", "recovery_step_failed", "recovered", "probe_due")
    ).order_by("-at")[:20 * max(len(nodes), 1)]
    return [{"node": n, "probes": probes[n.pk], "steps": [t for t in steps if t.node_id == n.pk][:10],
             "recovery_steps": n.group.thresholds().recovery_steps} for n in nodes]


@requires("read")
def canary_review(request: HttpRequest) -> HttpResponse:
    nodes = list(Node.objects.filter(retired=False, state__in=[s.label for s in CANARY_STATES])
                 .select_related("group").order_by("group__name", "name"))
    recovered_at: dict[int, Any] = {}
    for node_id, at in (Transition.objects.filter(reason="recovered", at__gte=timezone.now() - CANARY_HISTORY,
                                                   node__retired=False).exclude(node__in=nodes)
                        .order_by("-at").values_list("node_id", "at")[:200]):
        recovered_at.setdefault(node_id, at)
    recent = Node.objects.select_related("group").in_bulk(list(recovered_at)[:CANARY_HISTORY_NODES])
    recovered = sorted(recent.values(), key=lambda n: recovered_at[n.pk], reverse=True)
    for n in recovered:
        n.recovered_at = recovered_at[n.pk]
    return render(request, "dashboard/canary.html", _ctx(request, rows=_canary_rows(nodes),
                                                         recovered=_canary_rows(recovered)))


@requires("read")
def audit_log(request: HttpRequest) -> HttpResponse:
    flt = AuditFilter(request.GET or None, queryset=AuditEvent.objects.select_related("group", "node"))
    page = Paginator(flt.qs, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    # Runs of registrations (a fleet registered at once) folded into one entry each.
    return render(request, "dashboard/audit.html", _ctx(request, filter=flt, page=page, rows=fold(page),
                                                        query=query.urlencode()))


def _export(request: HttpRequest, filter_cls: Any, model: Any, name: str, columns: list[str],
            rows: Any) -> HttpResponse:
    """A CSV export under the page's filters; a filter the page would refuse is a 400 naming it."""
    from outlier_admin.history.export import csv_response

    flt = filter_cls(request.GET or None, queryset=model.objects.all())
    if request.GET and not flt.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in flt.errors.items())
        return HttpResponse(f"bad filter: {errors}\n", status=400, content_type="text/plain; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    return csv_response(f"outlier-admin-{name}-{stamp}.csv", columns, rows(flt.qs))


@requires("read")
@require_http_methods(["GET", "HEAD"])
def audit_csv(request: HttpRequest) -> HttpResponse:
    """The audit log as CSV, newest first, under the audit page's filters."""
    from outlier_admin.history.export import AUDIT_COLUMNS, audit_rows

    return _export(request, AuditFilter, AuditEvent, "audit", AUDIT_COLUMNS, audit_rows)


@requires("read")
@require_http_methods(["GET", "HEAD"])
def transitions_csv(request: HttpRequest) -> HttpResponse:
    """Every node's state changes as CSV, newest first (``group``, ``node``, ``since``, ``until``,
    ``reason``, ``to_state`` as the API's transitions list): the fleet-wide history for a review."""
    from outlier_admin.history.export import TRANSITION_COLUMNS, transition_rows

    return _export(request, TransitionFilter, Transition, "transitions", TRANSITION_COLUMNS, transition_rows)


@requires("read")
@require_http_methods(["GET", "HEAD"])  # a read page: a POST here is refused, never silently answered
def rejected_input(request: HttpRequest) -> HttpResponse:
    """What ingest refused: counts by reason and format over a window, then samples with the raw text
    (the counting is :mod:`outlier_admin.ingest.rejected`'s, as the API's)."""
    from datetime import timedelta

    from django.utils import timezone

    from outlier_admin.ingest.models import RejectedInput
    from outlier_admin.ingest.rejected import counts_by_reason, window_start

    hours = request.GET.get("hours", "24")
    hours = hours if hours in REJECTED_WINDOWS else "24"
    since = window_start(timezone.now() - timedelta(hours=int(hours)))
    flt = RejectedInputFilter(request.GET or None, queryset=RejectedInput.objects.order_by("-received_at", "-id"))
    page = Paginator(flt.qs, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "dashboard/rejected.html", _ctx(
        request, counts=counts_by_reason(since), since=since, hours=hours, windows=REJECTED_WINDOWS,
        filter=flt, page=page, query=query.urlencode()))


#: The rejected-input page's count windows, in hours (the API takes any ``since`` up to 30 days).
REJECTED_WINDOWS = ("1", "24", "168", "720")



def _admin(request: HttpRequest) -> HttpResponse | None:
    """None for an active superuser; else the login redirect or the 403 page (login lockouts are an
    administrator's to clear: a role-holder locked out must not be able to unlock the guesser)."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not (request.user.is_superuser and request.user.is_active):
        return render(request, "dashboard/forbidden.html", {"capability": "unlock logins", "roles": ["administrator"]},
                      status=403)
    return None


@require_http_methods(["GET", "POST"])
def login_lockouts(request: HttpRequest) -> HttpResponse:
    """The (username, address) pairs locked out of logging in, with an *Unlock* per pair (an
    administrator's, audited: :func:`~outlier_admin.control.actions.do_unlock_login`)."""
    from outlier_admin.fleet.login_throttle import locked_out

    refused = _admin(request)
    if refused is not None:
        return refused
    if request.method == "POST":
        form = ReasonForm(request.POST)
        username = request.POST.get("username", "")
        if not form.is_valid():
            messages.error(request, "A reason is required to unlock a login.")
        else:
            try:
                cleared = actions.do_unlock_login(username, ip_address=request.POST.get("ip_address") or None,
                                                  actor=request.user, reason=form.cleaned_data["reason"])
            except actions.ActionError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"Unlocked {username!r}: {cleared} failures cleared.")
        return redirect("dashboard:lockouts")
    return render(request, "dashboard/lockouts.html", _ctx(request, lockouts=locked_out(), max_failures=settings.LOGIN_MAX_FAILURES))
