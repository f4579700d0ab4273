"""Figures of one simulated run (the report's per-policy block) and the scenario-level figures.

Definitions (what an SRE reads in the report):

- Latency percentiles are per *client request*: first arrival at the gateway to its final answer
  (success, or the last failed attempt), so retries and timeouts are included. ``ttft_p99_ms``: first
  arrival to first token of the successful attempt.
- ``timeouts``: gateway log lines with status 0 (the client gave up after ``timeout_s``);
  ``timeout_rate = timeouts / attempts``; ``errors``: log lines with a 5xx status; ``client_failures``:
  requests whose last attempt failed; ``retries``: attempts beyond the first.
- ``first_degrade_s`` / ``quarantine_s``: seconds from the fault's onset to the node's first weight cut /
  first removal from service (``null``: never). ``traffic_share_after_detect``: the node's share of
  the group's attempts from first detection to the fault's end, over its fair share. ``recovery_s``:
  seconds after the fault ends until the node is back at full weight (``null``: the fault does not end,
  the node was never cut, or it never came back within the run).
- ``floor_s`` / ``delay_vs_floor``: the statistical floor on this policy's own records of the faulty
  node (see :func:`cusum_bounds`) and ``first_degrade_s`` over it. For a policy that read the
  streamed progress, also ``stream_floor_s`` / ``delay_vs_stream_floor``: the same oracle CUSUM on the
  node's per-tick streamed decode time (:func:`stream_floor`), the floor of a streaming detector.
- ``own_floor_s`` / ``delay_vs_own_floor``: the floor of the signal the policy used (the streamed one
  if it read the progress, else its records): the like-for-like comparison.
- Those floors are tuned to the policy's own false-alarm budget (``floor_budget``,
  :func:`false_alarm_budget`): the 95 % upper confidence bound of its false cuts per healthy
  node-hour, from a suite's healthy runs (``runner.healthy_budgets``) or its own run; the scenario's
  ``cusum_bound`` keeps the fixed one alarm per :data:`REFERENCE_NODE_HOURS`.
- A detection made while more than 30 % (the safeguard's fraction) of the group's healthy nodes is out
  of service earns no credit: its ``first_degrade_s`` / ``quarantine_s`` is ``null`` and the fault
  lists it under ``uncredited``.
- ``false_degrades`` / ``false_quarantines``: weight cuts / removals of nodes that are not in
  ``expect.faulty`` (events, not nodes). ``healthy_node_hours``: observation time of those nodes, the
  denominator of a false-alarm rate; ``healthy_out_of_service_node_hours``: how much of it they spent
  removed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detector.states import safeguard_cap
from detector.thresholds import Thresholds
from sim.cusum import cusum_min_delay, oracle_cusum_alarm, threshold_for_arl0
from sim.engine import KIND_CLIENT, STATUS_OK, STATUS_TIMEOUT, Simulation
from sim.scenario import Scenario

TIMELINE_BIN_S = 5.0
SAFEGUARD_FRACTION = Thresholds().max_quarantine_fraction  # the default every scenario group runs with
#: The fixed budget of the scenario-level floor (``cusum_bound``): one false alarm per this many node-hours.
REFERENCE_NODE_HOURS = 10_000.0
#: Confidence of the upper bound on a policy's false-alarm rate that sets its floor's budget.
BUDGET_CONFIDENCE = 0.95


def healthy_out(scn: Scenario, sim: Simulation, gi: int, t: float) -> int:
    """How many of group ``gi``'s healthy nodes (not in ``expect.faulty``) are out of service at ``t``."""
    faulty = {n for g, n in scn.faulty if _group_index(scn, g) == gi}
    return sum(1 for node in range(scn.groups[gi].nodes) if node not in faulty
               and node_state_at(sim.log.changes.get((gi, node), []), t)[1])


def over_safeguard(scn: Scenario, sim: Simulation, gi: int, t: float) -> bool:
    """More healthy nodes of group ``gi`` out at ``t`` than the detector's safeguard cap allows out
    (:func:`detector.states.safeguard_cap`): a sweep that removes that many also "detects" the faulty
    node."""
    return healthy_out(scn, sim, gi, t) > safeguard_cap(SAFEGUARD_FRACTION, scn.groups[gi].nodes)


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return round(float(np.percentile(x, q)), 1) if len(x) else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def client_latency_ms(sim: Simulation) -> np.ndarray:
    s = sim.summary_arrays()
    return (s["final_t"] - np.asarray(sim.r_t)) * 1000.0


def timeline(sim: Simulation, bin_s: float = TIMELINE_BIN_S) -> dict[str, list]:
    """Cluster P99 of client latency per ``bin_s`` bin of completion time (the plot's top panel)."""
    s = sim.summary_arrays()
    lat = client_latency_ms(sim)
    t = s["final_t"]
    ok = np.isfinite(t)
    bins = np.floor(t[ok] / bin_s).astype(np.int64)
    n_bins = math.ceil(sim.scn.duration_s / bin_s)
    out_t, out_p = [], []
    order = np.argsort(bins, kind="stable")
    b_sorted = bins[order]
    l_sorted = lat[ok][order]
    edges = np.searchsorted(b_sorted, np.arange(n_bins + 1))
    for b in range(n_bins):
        chunk = l_sorted[edges[b]:edges[b + 1]]
        out_t.append(round((b + 0.5) * bin_s, 1))
        out_p.append(round(float(np.percentile(chunk, 99)), 1) if len(chunk) else None)
    return {"t": out_t, "p99_ms": out_p}


def _group_index(scn: Scenario, name: str) -> int:
    return next(i for i, g in enumerate(scn.groups) if g.name == name)


def node_state_at(changes: list[tuple[float, float, bool]], t: float) -> tuple[float, bool]:
    w, q = 1.0, False
    for ct, cw, cq in changes:
        if ct > t:
            break
        w, q = cw, cq
    return w, q


def policy_report(scn: Scenario, sim: Simulation) -> dict[str, Any]:
    """The per-policy block of the report (schema keys plus documented extras)."""
    a = sim.attempts()
    client = a["kind"] == KIND_CLIENT
    gw = a["gw_status"][client]
    lat = client_latency_ms(sim)
    s = sim.summary_arrays()
    ttft = (s["ttft_t"] - np.asarray(sim.r_t)) * 1000.0
    n_att = int(client.sum())
    timeouts = int((gw == STATUS_TIMEOUT).sum())
    faulty = {(_group_index(scn, g), n) for g, n in scn.faulty}
    out: dict[str, Any] = {
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "p999_ms": _pct(lat, 99.9),
        "ttft_p99_ms": _pct(ttft[s["final_status"] == STATUS_OK], 99),
        "timeouts": timeouts,
        "timeout_rate": round(timeouts / n_att, 6) if n_att else 0.0,
        "errors": int((gw >= 500).sum()),
        "client_failures": int((s["final_status"] != STATUS_OK).sum()),
        "retries": int(n_att - len(sim.r_t)),
        "probes": int((a["kind"] != KIND_CLIENT).sum()),
    }
    # False alarms and exposure of healthy nodes.
    false_deg = false_q = 0
    healthy_hours = 0.0
    oos_hours = 0.0
    join_t: dict[tuple[int, int], float] = {}
    for f in scn.faults:
        if f.kind == "warmup" and f.node is not None:
            join_t[(_group_index(scn, f.group), f.node)] = f.start_s
    for gi, g in enumerate(scn.groups):
        for node in range(g.nodes):
            if (gi, node) in faulty:
                continue
            healthy_hours += (scn.duration_s - join_t.get((gi, node), 0.0)) / 3600.0
            prev_w, prev_q, prev_t = 1.0, False, 0.0
            for ct, cw, cq in sim.log.changes.get((gi, node), []):
                if prev_w >= 0.999 and not prev_q and (cw < 0.999 or cq):
                    false_deg += 1
                if cq and not prev_q:
                    false_q += 1
                if prev_q:
                    oos_hours += (min(ct, scn.duration_s) - prev_t) / 3600.0
                prev_w, prev_q, prev_t = cw, cq, ct
            if prev_q:
                oos_hours += max(0.0, scn.duration_s - prev_t) / 3600.0
    out["false_degrades"] = false_deg
    out["false_quarantines"] = false_q
    out["false_degrades_per_1000h"] = _r(1000 * false_deg / healthy_hours if healthy_hours else None, 1)
    out["false_quarantines_per_1000h"] = _r(1000 * false_q / healthy_hours if healthy_hours else None, 1)
    out["healthy_node_hours"] = round(healthy_hours, 4)
    out["healthy_out_of_service_node_hours"] = round(oos_hours, 4)
    # Per fault.
    faults = []
    for f in scn.faults:
        gi = _group_index(scn, f.group)
        entry: dict[str, Any] = {"group": f.group, "node": "all" if f.node is None else f.node, "kind": f.kind,
                                 "onset_s": f.start_s, "first_degrade_s": None, "quarantine_s": None,
                                 "traffic_share_after_detect": None, "recovery_s": None}
        if f.node is not None:
            changes = sim.log.changes.get((gi, f.node), [])
            end = f.end_s if f.end_s is not None else scn.duration_s
            deg = next((ct for ct, cw, cq in changes if ct >= f.start_s and (cw < 0.999 or cq)), None)
            q = next((ct for ct, cw, cq in changes if ct >= f.start_s and cq), None)
            # No credit for a detection made while more than the safeguard's fraction of healthy
            # nodes is out: a sweep that removes everyone also "detects" the faulty node.
            for name, when in (("first_degrade_s", deg), ("quarantine_s", q)):
                if when is not None and over_safeguard(scn, sim, gi, when):
                    entry.setdefault("uncredited", []).append(name)
            if "first_degrade_s" in entry.get("uncredited", ()):
                deg = None
            if "quarantine_s" in entry.get("uncredited", ()):
                q = None
            entry["first_degrade_s"] = _r(deg - f.start_s if deg is not None else None)
            entry["quarantine_s"] = _r(q - f.start_s if q is not None else None)
            det = deg if deg is not None else q
            if det is not None and det < end:
                node_g = np.asarray(sim.node_group)[a["node"][client]]
                in_win = (a["t"][client] >= det) & (a["t"][client] < end) & (node_g == gi)
                local = np.asarray(sim.node_local)[a["node"][client][in_win]]
                n_group = int(in_win.sum())
                if n_group:
                    present = sum(sim.members[gi])
                    entry["traffic_share_after_detect"] = _r((local == f.node).sum() / (n_group / present))
            if f.end_s is not None and det is not None and det < f.end_s:
                w, qq = node_state_at(changes, f.end_s)
                if w >= 0.999 and not qq:
                    entry["recovery_s"] = 0.0
                else:
                    back = next((ct for ct, cw, cq in changes if ct > f.end_s and cw >= 0.999 and not cq), None)
                    entry["recovery_s"] = _r(back - f.end_s if back is not None else None)
        faults.append(entry)
    out["faults"] = faults
    out["timeline"] = timeline(sim)
    out["read_progress"] = bool(sim.streaming and any(p.wants_progress for p in sim.policies))
    return out


def _fit_log_residual(y: np.ndarray, cols: list[np.ndarray]) -> np.ndarray:
    """Residuals of ``log y`` against ``log(least-squares linear fit of y on cols)``."""
    X = np.column_stack([np.ones(len(y)), *cols])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    pred = np.maximum(X @ coef, 1e-9)
    return np.log(y) - np.log(pred)


def signal_quality(scn: Scenario, sim: Simulation, seed_w: float = 0.25) -> dict[str, Any]:
    """Spread (sd of log) of each healthy signal, per group, from a fault-free run.

    - ``norm_seed``: ``total / (N_prompt * w + N_completion)`` with the seed's fixed ``w = 0.25``;
    - ``norm_learned``: ``total`` over a least-squares cost model ``a + b*N_prompt + c*N_completion``;
    - ``prefill``: TTFT over a fitted ``a + b*N_prompt``; ``decode``: ``(total - TTFT)/(N_completion - 1)``.

    ``pooled`` is the sd over all samples of the group (what a detector must see through per sample);
    ``peer`` is the sd of the per-node medians (the heterogeneity a peer baseline must absorb).
    """
    a = sim.attempts()
    ok = (a["kind"] == KIND_CLIENT) & (a["gw_status"] == STATUS_OK)
    req = a["req"][ok]
    p = np.asarray(sim.r_prompt, dtype=np.float64)[req]
    c = np.asarray(sim.r_comp, dtype=np.float64)[req]
    total = (a["gw_t"][ok] - a["t"][ok]) * 1000.0
    ttft = (a["ttft"][ok] - a["t"][ok]) * 1000.0
    node = a["node"][ok]
    gidx = np.asarray(sim.node_group)[node]
    out: dict[str, Any] = {}
    for gi, g in enumerate(scn.groups):
        m = gidx == gi
        if m.sum() < 50:
            continue
        sig: dict[str, np.ndarray] = {
            "norm_seed": np.log(total[m] / (p[m] * seed_w + c[m])),
            "norm_learned": _fit_log_residual(total[m], [p[m], c[m]]),
            "prefill": _fit_log_residual(np.maximum(ttft[m], 1e-6), [p[m]]),
        }
        d = c[m] > 1
        sig["decode"] = np.log(np.maximum((total[m][d] - ttft[m][d]) / (c[m][d] - 1), 1e-6))
        entry = {}
        for k, v in sig.items():
            nodes_k = node[m][d] if k == "decode" else node[m]
            meds = [float(np.median(v[nodes_k == n])) for n in np.unique(nodes_k) if (nodes_k == n).sum() >= 10]
            entry[k] = {"pooled": _r(float(np.std(v)), 4), "peer": _r(float(np.std(meds)), 4) if len(meds) > 1 else None}
        out[g.name] = entry
    return out


def cusum_bounds(scn: Scenario, sim: Simulation, false_alarm_node_hours: float = REFERENCE_NODE_HOURS,
                 window_s: float = 60.0) -> list[dict[str, Any]]:
    """The statistical floor per faulty node (see :func:`sim.cusum.cusum_min_delay`).

    Signal: ``log(service time / (prefill_ms * N_prompt + decode_ms * N_completion))`` per request (the
    node's own slowness, without queueing, i.e. the evidence available at onset). Pre-change: that
    node's requests completed before the onset (all healthy nodes' when fewer than 30); post-change: its
    requests started in ``[onset, onset + window_s)`` during the fault. ``δ`` is the mean shift in units
    of the pre-change sd. The false-alarm budget is one alarm per ``false_alarm_node_hours`` node-hours:
    ``ARL0 = rate * 3600 * false_alarm_node_hours`` samples, with ``rate`` the node's fair-share request
    rate ``(group requests / duration) / nodes``.

    ``min_delay_s`` converts samples to seconds at the node's request rate, as if each request's
    latency were known when it started. A gateway learns it only when the request completes, so
    ``observable_delay_s`` is the floor for a detector on access-log records: CUSUMs told the
    pre-change mean and sd, with ``h`` from the same budget, run over the node's records in
    completion order from the onset on (under ``round_robin``, which does not react), including
    requests that were in flight at the onset and carry part of the slowdown; the time from onset to
    the first alarm of the best of ``k = δ/2, δ/4, ..., δ/64`` (in-flight requests shift less than
    ``δ``, so the best reference is lower than for a step). Detection delays are fairly compared
    with this one.
    """
    req_sig = _request_signal(sim)
    node, start, end_t, sig = req_sig
    out = []
    for gname, local in scn.faulty:
        gi = _group_index(scn, gname)
        n_glob = sim.offset[gi] + local
        f = next((f for f in scn.faults if f.group == gname and f.node == local), None)
        if f is None:
            continue
        end = min(f.end_s if f.end_s is not None else scn.duration_s, f.start_s + window_s)
        mine = node == n_glob
        before = sig[mine & (end_t < f.start_s)]
        if len(before) < 30:
            healthy = np.asarray([sim.node_group[n] == gi for n in range(len(sim.node_group))])[node]
            before = sig[healthy & ~mine]
        after = sig[mine & (start >= f.start_s) & (start < end)]
        rate = float((np.asarray(sim.r_group) == gi).sum()) / scn.duration_s / scn.groups[gi].nodes
        entry: dict[str, Any] = {"group": gname, "node": local, "kind": f.kind, "min_delay_s": None}
        if len(before) >= 10 and len(after) >= 5:
            sd = float(np.std(before))
            delta = (float(np.mean(after)) - float(np.mean(before))) / sd if sd > 0 else math.inf
            arl0 = rate * 3600.0 * false_alarm_node_hours
            samples = cusum_min_delay(delta, arl0)
            entry.update({
                "observable_delay_s": None,
                "delta_sd": _r(delta), "arl0_samples": _r(arl0, 0), "arl1_samples": _r(samples),
                "node_rate_rps": _r(rate), "min_delay_s": _r(samples / rate if samples is not None else None),
                "samples_pre": len(before), "samples_post": len(after),
                "pre_mean": _r(float(np.mean(before)), 6), "pre_sd": _r(sd, 6),
            })
            entry["observable_delay_s"] = observable_floor(req_sig, entry, n_glob, f.start_s)
        out.append(entry)
    return out


def _request_signal(sim: Simulation) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per successful client attempt: node, start, end and ``log(service / healthy service)``."""
    a = sim.attempts()
    ok = (a["kind"] == KIND_CLIENT) & np.isfinite(a["service_ms"]) & (a["status"] == STATUS_OK)
    req = a["req"][ok]
    node = a["node"][ok]
    p = np.asarray(sim.r_prompt, dtype=np.float64)[req]
    c = np.asarray(sim.r_comp, dtype=np.float64)[req]
    pre_ms = np.asarray(sim.pre_ms)[node]
    dec_ms = np.asarray(sim.dec_ms)[node]
    sig = np.log(a["service_ms"][ok] / (pre_ms * p + dec_ms * c))
    return node, a["start"][ok], a["end"][ok], sig


def observable_floor(req_sig: tuple[np.ndarray, ...], bound: dict[str, Any], n_glob: int,
                     onset: float) -> float | None:
    """Seconds from ``onset`` to the first alarm of the oracle CUSUMs of :func:`cusum_bounds` on the
    records of node ``n_glob`` in one run (``req_sig`` from :func:`_request_signal` of that run)."""
    node, _, end_t, sig = req_sig
    delta, sd, arl0 = bound.get("delta_sd"), bound.get("pre_sd"), bound.get("arl0_samples")
    if sd is None or (sd > 0 and (delta is None or not delta > 0)):
        return None
    seen = (node == n_glob) & (end_t >= onset)
    by_end = np.argsort(end_t[seen], kind="stable")
    return _oracle_delay(end_t[seen][by_end], sig[seen][by_end], bound["pre_mean"], sd, delta, arl0, onset)


def _oracle_delay(times: np.ndarray, values: np.ndarray, mean: float, sd: float, delta: float | None,
                  arl0: float, onset: float) -> float | None:
    """Seconds from ``onset`` to the first alarm over ``values`` (seen at ``times``, in that order) of
    the best of the oracle CUSUMs ``k = δ/2, δ/4 .. δ/64`` told ``mean`` and ``sd``, with ``h`` from
    ``arl0``; noise-free (``sd == 0``), the first value above ``mean`` is proof. ``None``: no alarm."""
    if sd == 0:
        over = np.flatnonzero(values > mean + 1e-12)
        return _r(float(times[over[0]]) - onset) if len(over) else None
    x = (values - mean) / sd
    # Requests in flight at the onset carry only part of the shift: a CUSUM tuned for the full
    # shift ignores them, one tuned lower uses them. The oracle takes the best tuning.
    alarms = [oracle_cusum_alarm(x, k, threshold_for_arl0(arl0, k)) for k in (delta / 2) * 0.5 ** np.arange(6)]
    alarms = [i for i in alarms if i is not None]
    return _r(float(times[min(alarms)]) - onset) if alarms else None


def poisson_rate_upper(k: int, exposure: float, confidence: float = BUDGET_CONFIDENCE) -> float:
    """One-sided upper confidence bound on a Poisson rate from ``k`` events in ``exposure``: the
    ``lam`` with ``P(X <= k; lam * exposure) = 1 - confidence`` (bisection on the CDF; with no event,
    ``-ln(1 - confidence) / exposure``, 3.0 / exposure at 95 %: the "rule of three")."""
    if exposure <= 0:
        return math.inf
    target = 1.0 - confidence

    def cdf(mu: float) -> float:
        term = total = math.exp(-mu)
        for j in range(1, k + 1):
            term *= mu / j
            total += term
        return total

    lo, hi = 0.0, max(1.0, 2.0 * (k + 1))
    while cdf(hi) > target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi / exposure


def false_alarm_budget(false_alarms: int, node_hours: float, source: str) -> dict[str, Any]:
    """A policy's floor budget from its measured false alarms (weight cuts of healthy nodes: the
    detection the floor is compared with is the first cut) in ``node_hours`` of healthy nodes.

    Rule: the budget is the **95 % upper confidence bound** of the policy's false-alarm rate, for any
    count (with none, ``3.0 / node_hours``): a policy is compared with the best detector allowed at
    least as many false alarms as it may have, never fewer, and a policy with few healthy hours
    observed gets no floor harder than its data can show. ``node_hours_per_alarm`` is its inverse,
    what :func:`stream_floor` and :func:`observable_floor` take."""
    upper = poisson_rate_upper(int(false_alarms), node_hours)
    return {"false_alarms": int(false_alarms), "node_hours": round(float(node_hours), 4),
            "rate_per_1000h": _r(1000.0 * false_alarms / node_hours if node_hours > 0 else None, 1),
            "budget_per_1000h": _r(1000.0 * upper, 1),
            "node_hours_per_alarm": _r(1.0 / upper if upper > 0 and math.isfinite(upper) else None, 4),
            "confidence": BUDGET_CONFIDENCE, "source": source}


def own_run_budget(policy: dict[str, Any]) -> dict[str, Any]:
    """The budget from one run's own healthy nodes (when no healthy runs of a suite are given)."""
    return false_alarm_budget(policy.get("false_degrades", 0), policy.get("healthy_node_hours", 0.0), "this run")


def add_floor_ratios(scn: Scenario, sim: Simulation, policy: dict[str, Any], bounds: list[dict[str, Any]],
                     budget: dict[str, Any] | None = None) -> None:
    """Per fault of one policy's report: ``floor_s``, the observable floor on *this run's* records
    (routing differs between policies before the fault, so each gets its own), and
    ``delay_vs_floor = first_degrade_s / floor_s``; the same for the streamed progress. Each floor is
    tuned to ``budget`` (:func:`false_alarm_budget`: the policy's own measured false-alarm rate),
    recorded as ``policy["floor_budget"]``; without one, to the fixed :data:`REFERENCE_NODE_HOURS`."""
    req_sig = _request_signal(sim)
    hours = REFERENCE_NODE_HOURS
    if budget is not None and budget.get("node_hours_per_alarm"):
        hours = float(budget["node_hours_per_alarm"])
        policy["floor_budget"] = budget
    for entry in policy["faults"]:
        b = next((b for b in bounds if b["group"] == entry["group"] and b["node"] == entry["node"]), None)
        if b is None or "pre_sd" not in b:
            continue
        gi = _group_index(scn, entry["group"])
        if b.get("node_rate_rps"):
            b = {**b, "arl0_samples": float(b["node_rate_rps"]) * 3600.0 * hours}
        floor = observable_floor(req_sig, b, sim.offset[gi] + entry["node"], entry["onset_s"])
        entry["floor_s"] = floor
        det = entry["first_degrade_s"]
        entry["delay_vs_floor"] = _r(det / floor) if det is not None and floor else None
        ticks = sim.log.progress.get((gi, entry["node"]))
        if ticks:
            f = next(f for f in scn.faults if f.group == entry["group"] and f.node == entry["node"])
            sfloor = stream_floor(ticks, entry["onset_s"], f.end_s, false_alarm_node_hours=hours)
            entry["stream_floor_s"] = sfloor
            entry["delay_vs_stream_floor"] = _r(det / sfloor) if det is not None and sfloor else None
        # The floor of the signal the policy used: streamed progress if it read it, else its records.
        if policy.get("read_progress") and entry.get("stream_floor_s") is not None:
            entry["own_floor_s"], entry["delay_vs_own_floor"] = entry["stream_floor_s"], entry["delay_vs_stream_floor"]
        else:
            entry["own_floor_s"], entry["delay_vs_own_floor"] = entry["floor_s"], entry["delay_vs_floor"]


def stream_floor(ticks: list[tuple[float, float, float]], onset: float, end: float | None,
                 false_alarm_node_hours: float = REFERENCE_NODE_HOURS, window_s: float = 60.0) -> float | None:
    """Seconds from ``onset`` to the first alarm of an oracle CUSUM on a node's streamed progress.

    One sample per tick: ``log(inter-token seconds / tokens)``, the node's mean decode time per token
    over the tick. The oracle knows the pre-change mean and sd (the node's ticks in the minute before
    the onset) and the shift (its ticks in ``(onset, onset + window_s]``); ``h`` comes from one false
    alarm per ``false_alarm_node_hours`` at one sample per tick, and the best of ``k = δ/2 .. δ/64``
    is taken, as for :func:`observable_floor`. ``None`` when there is too little to tell.
    """
    arr = np.asarray([(t, s / k) for t, k, s in ticks if k > 0])
    if len(arr) < 20:
        return None
    t, v = arr[:, 0], np.log(arr[:, 1])
    before = v[(t <= onset) & (t > onset - 60.0)]
    stop = min(end if end is not None else math.inf, onset + window_s)
    after_mask = (t > onset) & (t <= stop)
    if len(before) < 10 or after_mask.sum() < 3:
        return None
    mean, sd = float(before.mean()), float(before.std())
    arl0 = false_alarm_node_hours * 3600.0 / float(np.median(np.diff(t)))
    delta = float((v[after_mask].mean() - mean) / sd) if sd > 0 else None
    if delta is not None and not delta > 0:
        return None
    return _oracle_delay(t[after_mask], v[after_mask], mean, sd, delta, arl0, onset)
