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
- ``bound_s`` / ``delay_vs_bound``: the **oracle lower bound** on this policy's detection delay
  (:func:`add_bounds`): the first alarm after the onset of a CUSUM on the empirical log-likelihood
  ratio of the samples the policy reads (``policies.ORACLE_STREAMS``) on the faulty node in this run,
  told their pre-fault and post-onset histograms, with its threshold set so that it raises the
  policy's own false-cut rate on the healthy nodes' samples of the run; ``first_degrade_s`` over it.
  ``bound_low_s`` is the bound's lower end (``bound_error = 1 - bound_low_s / bound_s``: the 95 %
  upper confidence bound of the policy's false-alarm rate instead of its point estimate, and the alarm
  one sample earlier). A policy faster than ``bound_low_s`` beat the oracle on the same samples: the
  bound is wrong for it (it reads something the oracle does not model), ``bound_violated`` is true and
  ``delay_vs_bound`` is ``null``. ``bound_basis`` says what the bound was computed on (streams,
  samples, the post-onset window, how ``h`` was found), ``bound_note`` why there is none.
- The false-alarm rate (``floor_budget``, :func:`false_alarm_budget`): the policy's false cuts per
  healthy node-hour, from a suite's healthy runs (``runner.healthy_budgets``) or its own run; with
  none, the 95 % upper confidence bound (3.0 / node-hours). The scenario's ``cusum_bound`` is a
  Gaussian-theory reference at a fixed one alarm per :data:`REFERENCE_NODE_HOURS` on the
  ``round_robin`` run, not a bound.
- A detection made while more than 30 % (the safeguard's fraction) of the group's healthy nodes is out
  of service earns no credit: its ``first_degrade_s`` / ``quarantine_s`` is ``null`` and the fault
  lists it under ``uncredited``.
- ``cuts``: the run's cut events for precision and recall (:func:`cut_counts`).
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
from sim.cusum import cusum_min_delay
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
    out["cuts"] = cut_counts(scn, sim)
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


def cut_counts(scn: Scenario, sim: Simulation) -> dict[str, int]:
    """Cut events (a node going from full weight and in service to cut or out) of one run, for
    precision and recall (``runner.precision_recall``): ``true`` on a node of ``expect.faulty`` at or
    after the onset of its first fault, ``false`` any other (a healthy node, or a faulty one before its
    fault); ``faulty_nodes`` and ``faulty_nodes_cut`` (at least one true cut)."""
    faulty = {(_group_index(scn, g), n) for g, n in scn.faulty}
    onset = {}
    for f in scn.faults:
        if f.node is not None:
            key = (_group_index(scn, f.group), f.node)
            onset[key] = min(onset.get(key, math.inf), f.start_s)
    true = false = 0
    cut_nodes = set()
    for key, changes in sim.log.changes.items():
        prev_w, prev_q = 1.0, False
        for ct, cw, cq in changes:
            if prev_w >= 0.999 and not prev_q and (cw < 0.999 or cq):
                if key in faulty and ct >= onset.get(key, 0.0):
                    true += 1
                    cut_nodes.add(key)
                else:
                    false += 1
            prev_w, prev_q = cw, cq
    return {"true": true, "false": false, "faulty_nodes": len(faulty), "faulty_nodes_cut": len(cut_nodes)}


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
    latency were known when it started: Gaussian theory at a fixed budget, a reference for the shift's
    size. The bound a policy is held to is :func:`add_bounds`'s.
    """
    node, start, end_t, sig = _request_signal(sim)
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
                "delta_sd": _r(delta), "arl0_samples": _r(arl0, 0), "arl1_samples": _r(samples),
                "node_rate_rps": _r(rate), "min_delay_s": _r(samples / rate if samples is not None else None),
                "samples_pre": len(before), "samples_post": len(after),
                "pre_mean": _r(float(np.mean(before)), 6), "pre_sd": _r(sd, 6),
            })
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
    """A policy's measured false-alarm rate (weight cuts of healthy nodes: the detection the bound is
    compared with is the first cut) in ``node_hours`` of healthy nodes.

    ``rate_per_node_hour`` is what the oracle bound is calibrated to: the measured rate, or, with no
    false cut, its 95 % upper confidence bound (``3.0 / node_hours``: a policy with few healthy hours
    observed gets no bound harder than its data can show). ``upper_per_node_hour``, the 95 % upper
    bound for any count, sets the bound's lower end (:func:`add_bounds`). ``budget_per_1000h`` and
    ``node_hours_per_alarm`` state the upper bound per 1,000 node-hours and its inverse."""
    upper = poisson_rate_upper(int(false_alarms), node_hours)
    rate = false_alarms / node_hours if false_alarms > 0 and node_hours > 0 else upper
    return {"false_alarms": int(false_alarms), "node_hours": round(float(node_hours), 4),
            "rate_per_1000h": _r(1000.0 * false_alarms / node_hours if node_hours > 0 else None, 1),
            "budget_per_1000h": _r(1000.0 * upper, 1),
            "node_hours_per_alarm": _r(1.0 / upper if upper > 0 and math.isfinite(upper) else None, 4),
            "rate_per_node_hour": _r(rate, 6), "upper_per_node_hour": _r(upper, 6),
            "confidence": BUDGET_CONFIDENCE, "source": source}


def own_run_budget(policy: dict[str, Any]) -> dict[str, Any]:
    """The budget from one run's own healthy nodes (when no healthy runs of a suite are given)."""
    return false_alarm_budget(policy.get("false_degrades", 0), policy.get("healthy_node_hours", 0.0), "this run")


#: Seconds after the start of a run the oracle leaves out (the engines fill up, EMAs start).
BOUND_WARM_S = 5.0
#: The post-onset histogram is estimated on at most this many seconds after the onset.
BOUND_POST_WINDOW_S = 60.0
#: The group's level of each signal is its healthy nodes' median per bin of this many seconds.
BOUND_PEER_BIN_S = 2.0
#: Fewest samples of a signal, before the onset and after it, to estimate its histograms.
BOUND_MIN_SAMPLES = 10
#: Post-onset samples of a signal the post-fault histogram wants from the policy's own run.
BOUND_POST_SAMPLES = 30
#: Resampled post-onset streams that give the bound's sampling error (its 5th percentile).
BOUND_RESAMPLES = 200


def bound_samples(scn: Scenario, sim: Simulation, streams: tuple[str, ...]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per node (global id): the times and the values (one column per signal of ``streams``, NaN where
    a sample has none) of the samples a policy reads, in time order (``policies.ORACLE_STREAMS``):

    - per access-log line (client attempts, at the time the gateway logs them; a timeout is a line
      with ``total = timeout``): ``log_total`` = log total ms; ``t_norm`` = log of seed 000's
      ``total / (prompt * 0.25 + completion)``; ``decode`` = log ``(total - TTFT) / (completion - 1)``
      (a success with TTFT logged and >= 2 tokens); ``prefill`` = log ``TTFT / prompt``; ``failed`` =
      1 for a non-200 line, else 0;
    - per node and scrape period of streamed progress (``Simulation.log.rows``): ``itl_row`` = log of
      the inter-token seconds per token the node streamed, over a healthy node's at that load
      (:func:`equal_load_itl`).
    """
    a = sim.attempts()
    line = (a["kind"] == KIND_CLIENT) & (a["gw_status"] >= 0)
    node = a["node"][line]
    t = a["gw_t"][line]
    status = a["gw_status"][line]
    req = a["req"][line]
    p = np.asarray(sim.r_prompt, dtype=np.float64)[req]
    c = np.asarray(sim.r_comp, dtype=np.float64)[req]
    total = (t - a["t"][line]) * 1000.0
    ok = status == STATUS_OK
    ttft = np.where(ok & scn.logs_ttft, (a["ttft"][line] - a["t"][line]) * 1000.0, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        cols = {
            "log_total": np.log(total),
            "t_norm": np.log(total / (p * 0.25 + c)),
            "decode": np.where(ok & (c >= 2), np.log((total - ttft) / np.maximum(c - 1, 1)), np.nan),
            "prefill": np.log(ttft / np.maximum(p, 1)),
            "failed": (~ok).astype(np.float64),
        }
    rec_cols = [k for k in streams if k != "itl_row"]
    rec_x = np.column_stack([cols[k] for k in rec_cols]) if rec_cols else np.zeros((len(t), 0))
    per_node: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    k = len(streams)
    if rec_cols:
        order = np.argsort(node, kind="stable")
        bounds = np.searchsorted(node[order], np.arange(len(sim.node_group) + 1))
        for n in range(len(sim.node_group)):
            idx = order[bounds[n]:bounds[n + 1]]
            x = np.full((len(idx), k), np.nan)
            for j, name in enumerate(streams):
                if name != "itl_row":
                    x[:, j] = rec_x[idx, rec_cols.index(name)]
            per_node.setdefault(n, []).append((t[idx], x))
    if "itl_row" in streams:
        j = streams.index("itl_row")
        for gi, rows in sim.log.rows.items():
            if not rows:
                continue
            rt = np.asarray([r[0] for r in rows])
            tok, secs, running, prompt, kv = (np.asarray([r[i] for r in rows]) for i in range(1, 6))
            healthy = np.ones(tok.shape[1], dtype=bool)
            healthy[[n for g, n in scn.faulty if _group_index(scn, g) == gi]] = False
            v = equal_load_itl(tok, secs, running, prompt, kv, healthy)
            for local in range(tok.shape[1]):
                x = np.full((len(rt), k), np.nan)
                x[:, j] = v[:, local]
                per_node.setdefault(sim.offset[gi] + local, []).append((rt, x))
    out = {}
    for n, parts in per_node.items():
        tt = np.concatenate([q[0] for q in parts])
        xx = np.concatenate([q[1] for q in parts])
        keep = np.isfinite(xx).any(axis=1) & (tt >= BOUND_WARM_S)
        o = np.argsort(tt[keep], kind="stable")
        out[n] = (tt[keep][o], xx[keep][o])
    return out


def equal_load_itl(tok: np.ndarray, secs: np.ndarray, running: np.ndarray, prompt: np.ndarray, kv: np.ndarray,
                   healthy: np.ndarray) -> np.ndarray:
    """Per row (time x node): log of the inter-token time per token over what a healthy node decodes
    at that load, ``log(secs / tok) - f(B, W, B*W, K)``, ``f`` the least-squares fit over the healthy
    nodes' rows (``B`` running requests, ``W`` prompt tokens per decode token, ``K`` KV-cache usage:
    every stream of a node shares one step, whose time grows with them), loads clipped to the healthy
    rows' range; NaN where nothing streamed. The oracle knows the healthy curve as it knows the
    distributions: a busier healthy node is not evidence (``detector/signals.py`` fits the same
    curve)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(tok > 0, np.log(secs / tok), np.nan)
        w = np.where(tok > 0, prompt / tok, np.nan)
    ok = np.isfinite(y) & np.isfinite(w)
    fit = ok & healthy[None, :]
    if fit.sum() < 20:
        return y
    feats = []
    for f in (running, w, kv):
        lo, hi = np.nanmin(f[fit]), np.nanmax(f[fit])
        feats.append(np.clip(f, lo, hi))
    b, ww, k = feats
    x = np.stack([np.ones_like(b), b, ww, b * ww, k], axis=-1)
    coef, *_ = np.linalg.lstsq(x[fit], y[fit], rcond=None)
    return np.where(ok, y - x @ coef, np.nan)


def oracle_bound(scn: Scenario, samples: dict[int, tuple[np.ndarray, np.ndarray]], streams: tuple[str, ...],
                 gi: int, local: int, onset: float, end: float | None, cut: float | None,
                 rate: float, upper: float, offset: int,
                 unreacted: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """The oracle bound for faulty node ``local`` of group ``gi`` (module docstring, ``bound_*``).

    Each value is first taken relative to the group's level at the time (the median of the healthy
    nodes' values in its :data:`BOUND_PEER_BIN_S` bin: load and request mix move every node together,
    and the oracle knows which nodes are healthy) and then to the node's own median of that before the
    group's first onset (a node 3 % slower by birth is not evidence), except ``failed`` (0 or 1).
    Pre-fault histogram: the faulty node's samples from :data:`BOUND_WARM_S` to the onset. Post-onset:
    its samples from the onset to the policy's first cut ``cut`` (at most :data:`BOUND_POST_WINDOW_S`,
    before the fault ends) when there are :data:`BOUND_POST_SAMPLES` of a signal; a policy that cut
    sooner saw fewer, and after a cut the node gets little traffic and a smaller batch decodes faster
    (the policy's reaction, not the fault), so then the first :data:`BOUND_POST_SAMPLES` after the onset
    in ``unreacted`` (the same scenario and seed under ``round_robin``, which never reacts), centred the
    same way. ``bound_basis.post_source`` says which, per signal. The CUSUM runs over the node's
    samples from the warm-up (restarted at 0 after an alarm, so an alarm before the onset is a false
    one): the policy's own up to its cut, then, if it has not alarmed yet, ``unreacted``'s (what the
    node shows when nobody reacts; ``bound_basis.stream`` says so); the bound is its first alarm at or
    after the onset. The post-onset law is modelled twice (:class:`sim.cusum.HistogramLLR`, a monotone
    histogram ratio; :class:`sim.cusum.ShiftLLR`, the pre-fault density moved by the medians' shift);
    one CUSUM per signal and model and one on all signals per model (their LLRs added); the bound is
    the earliest (the oracle knows ``p1``, so which signal the fault moves and how;
    ``bound_basis.candidates`` lists each). ``h`` comes from the healthy nodes of the group in the policy's run
    (:func:`sim.cusum.calibrate_threshold`) at ``rate``. The lower end ``bound_low_s`` is the least
    of: the alarm at ``h`` for ``upper`` alarms per node-hour, the sample before it, and the 5th
    percentile of the alarm over :data:`BOUND_RESAMPLES` post-onset streams resampled from this one
    (the same times, LLRs drawn with replacement, from the CUSUM's value at the onset): the run-to-run
    spread of the oracle itself."""
    from sim.cusum import HistogramLLR, ShiftLLR

    faulty = {offset + n for g, n in scn.faulty if _group_index(scn, g) == gi}
    first_onset = min((f.start_s for f in scn.faults if _group_index(scn, f.group) == gi), default=onset)
    nodes = [offset + i for i in range(scn.groups[gi].nodes) if offset + i in samples]
    me = offset + local
    if me not in samples:
        return {"bound_note": "no sample of the faulty node in the signals the policy reads"}
    binary = [name == "failed" for name in streams]

    healthy = [n for n in nodes if n not in faulty]

    def peer_level(smp: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """The group's level per signal and time bin: the median over its healthy nodes' samples."""
        n_bins = int(scn.duration_s // BOUND_PEER_BIN_S) + 2
        level = np.full((n_bins, len(streams)), np.nan)
        own = [n for n in healthy if n in smp]
        if not own:
            return level
        ht = np.concatenate([smp[n][0] for n in own])
        hx = np.concatenate([smp[n][1] for n in own])
        hb = np.minimum((ht // BOUND_PEER_BIN_S).astype(np.int64), n_bins - 1)
        for j in range(len(streams)):
            if binary[j]:
                continue
            ok = np.isfinite(hx[:, j])
            order = np.lexsort((hx[ok, j], hb[ok]))
            bins_j, vals = hb[ok][order], hx[ok, j][order]
            edges = np.searchsorted(bins_j, np.arange(n_bins + 1))
            for b in range(n_bins):
                if edges[b + 1] - edges[b] >= 3:
                    level[b, j] = vals[(edges[b] + edges[b + 1]) // 2]
        return level

    levels = {id(samples): peer_level(samples)}
    if unreacted is not None:
        levels[id(unreacted)] = peer_level(unreacted)

    def centred(n: int, smp: dict[int, tuple[np.ndarray, np.ndarray]] = samples) -> np.ndarray:
        t, x = smp[n]
        x = x.copy()
        level = levels[id(smp)]
        lv = level[np.minimum((t // BOUND_PEER_BIN_S).astype(np.int64), len(level) - 1)]
        pre = t < first_onset
        for j in range(x.shape[1]):
            if binary[j]:
                continue
            x[:, j] -= np.where(np.isfinite(lv[:, j]), lv[:, j], 0.0)
            ref = x[pre, j]
            ref = ref[np.isfinite(ref)]
            if len(ref) < BOUND_MIN_SAMPLES:
                ref = x[:, j][np.isfinite(x[:, j])]
            if len(ref):
                x[:, j] -= float(np.median(ref))
        return x

    t, x = samples[me][0], centred(me)
    stop = min(v for v in (onset + BOUND_POST_WINDOW_S, end, cut, scn.duration_s) if v is not None)
    fault_end = min(end if end is not None else math.inf, scn.duration_s)
    if unreacted is not None and me in unreacted:
        ut, ux = unreacted[me][0], centred(me, unreacted)
    else:
        ut, ux = t[:0], x[:0]
    tables, sources = [], []
    n_pre = n_post = 0
    for j, name in enumerate(streams):
        col = x[:, j]
        has = np.isfinite(col)
        pre = col[has & (t < onset)]
        post = col[has & (t >= onset) & (t < stop)]
        source = (f"{len(post)} samples from the onset to the policy's cut" if cut is not None and cut <= stop
                  else f"{len(post)} samples in {stop - onset:g} s after the onset")
        if len(post) < BOUND_POST_SAMPLES:
            ucol = ux[:, j]
            after = np.flatnonzero(np.isfinite(ucol) & (ut >= onset) & (ut < fault_end))[:BOUND_POST_SAMPLES]
            post = ucol[after]
            source = (f"the first {len(after)} after the onset under round_robin (to +{ut[after[-1]] - onset:.2f} s): "
                      f"the policy cut sooner" if len(after) else "none")
        if len(pre) < BOUND_MIN_SAMPLES or len(post) < BOUND_MIN_SAMPLES:
            continue
        tables.append((j, HistogramLLR.fit(pre, post), "histogram"))
        if not binary[j]:
            tables.append((j, ShiftLLR.fit(pre, post), "shift"))
        sources.append(f"{name}: {source}")
        n_pre, n_post = n_pre + len(pre), n_post + len(post)
    if not tables:
        return {"bound_note": f"fewer than {BOUND_MIN_SAMPLES} samples before or after the onset in "
                              f"{', '.join(streams)}"}

    hours = sum(max(0.0, float(samples[n][0][-1]) - BOUND_WARM_S) for n in healthy if len(samples[n][0])) / 3600.0
    common: dict[str, Any] = {"post_source": "; ".join(sources), "samples_pre": n_pre, "samples_post": n_post,
                              "healthy_nodes": len(healthy), "healthy_node_hours": round(hours, 4),
                              "rate_per_node_hour": _r(rate, 6)}
    if not healthy or hours <= 0:
        return {"bound_note": "no healthy node in the group to calibrate the threshold on", "bound_basis": common}
    healthy_x = [centred(n) for n in healthy]
    switch = cut is not None and unreacted is not None and me in unreacted and cut < fault_end
    # Each signal alone and all of them together: the oracle knows which signal the fault moves (it
    # knows p1) and watches the one that alarms first, each at the policy's false-alarm rate.
    candidates = [[k] for k in range(len(tables))]
    for model in ("histogram", "shift"):
        every = [k for k, (_, _, m) in enumerate(tables) if m == model]
        if len({tables[k][0] for k in every}) > 1:
            candidates.append(every)
    results = []
    for js in candidates:
        chosen = [tables[k][:2] for k in js]
        res = _oracle_delay(chosen, healthy_x, hours, (t, x), (ut, ux) if switch else None, cut, onset,
                            fault_end, rate, upper)
        res["bound_basis"] = {"streams": [streams[tables[k][0]] for k in js], "model": tables[js[0]][2],
                              **res.get("bound_basis", {}), **common}
        results.append(res)
    found = [r for r in results if r.get("bound_s") is not None]
    if not found:
        return {"bound_note": "the oracle raised no alarm before the fault ended", "bound_basis": results[-1]["bound_basis"]}
    best = min(found, key=lambda r: (r["bound_s"], r["bound_low_s"]))
    best["bound_basis"]["candidates"] = {f"{'+'.join(r['bound_basis']['streams'])} ({r['bound_basis']['model']})":
                                         r.get("bound_s") for r in results}
    return best


def _oracle_delay(tables: list[tuple[int, Any]], healthy_x: list[np.ndarray], hours: float,
                  own: tuple[np.ndarray, np.ndarray], unreacted: tuple[np.ndarray, np.ndarray] | None,
                  cut: float | None, onset: float, fault_end: float, rate: float, upper: float) -> dict[str, Any]:
    """One oracle of :func:`oracle_bound` on the signals ``tables`` (column, LLR) of the samples."""
    from sim.cusum import calibrate_threshold, cusum_alarms, cusum_value

    cols = [j for j, _ in tables]

    def llr(xv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The LLR of each sample that has one of the signals, and which samples those are."""
        has = np.isfinite(xv[:, cols]).any(axis=1)
        out = np.zeros(int(has.sum()))
        for j, tab in tables:
            out += tab(xv[has, j])
        return out, has

    streams_h = [llr(xv)[0] for xv in healthy_x]
    t, x = own
    basis: dict[str, Any] = {}
    if unreacted is not None and cut is not None:
        ut, ux = unreacted
        l1, m1 = llr(x[t < cut])
        l2, m2 = llr(ux[ut >= cut])
        mine_t = np.concatenate([t[t < cut][m1], ut[ut >= cut][m2]])
        mine = np.concatenate([l1, l2])
        basis["stream"] = f"the policy's run to its cut at +{cut - onset:.3f} s, then the round_robin run"
    else:
        mine, m = llr(x)
        mine_t = t[m]
        basis["stream"] = "the policy's run"

    def delay(h: float) -> tuple[float | None, float | None]:
        """(first alarm at or after the onset, the sample before it), seconds after the onset."""
        for i in cusum_alarms(mine, h):
            if mine_t[i] >= onset:
                if mine_t[i] >= fault_end:
                    return None, None
                prev = mine_t[i - 1] if i > 0 and mine_t[i - 1] >= onset else onset
                return float(mine_t[i]) - onset, float(prev) - onset
        return None, None

    h, method = calibrate_threshold(streams_h, hours, rate)
    h_hi, _ = calibrate_threshold(streams_h, hours, upper) if upper > rate else (h, method)
    basis.update({"h": round(h, 3), "h_method": method, "h_at_upper_rate": round(h_hi, 3)})
    bound, _ = delay(h)
    if bound is None:
        return {"bound_basis": basis}
    _, low = delay(h_hi)
    low = bound if low is None else min(low, bound)
    # The bound's own sampling error: the same oracle over post-onset streams resampled from this one
    # (the samples' times kept, their LLRs drawn with replacement), from the CUSUM's value at the onset.
    post = mine_t >= onset
    horizon = post & (mine_t < onset + 3.0 * max(bound, 1.0))
    s_onset = cusum_value(mine[~post], h_hi)
    pool, times = mine[horizon], mine_t[horizon]
    rng = np.random.default_rng(BOUND_RESAMPLES)
    boot = []
    for _ in range(BOUND_RESAMPLES):
        alarm = cusum_alarms(rng.choice(pool, len(pool)), h_hi, cap=1, start=s_onset)
        boot.append(float(times[alarm[0]]) - onset if alarm else math.inf)
    p5 = float(np.percentile(boot, 5))
    basis["resampled_p5_s"] = _r(p5)
    low = min(low, p5)
    return {"bound_s": _r(bound), "bound_low_s": _r(low), "bound_error": _r(1.0 - low / bound if bound > 0 else 0.0),
            "bound_basis": basis}


def add_bounds(scn: Scenario, sim: Simulation, name: str, policy: dict[str, Any],
               budget: dict[str, Any] | None = None, unreacted: Simulation | None = None) -> None:
    """Per fault of policy ``name``'s report: the oracle bound on its own run (:func:`oracle_bound`),
    calibrated to ``budget`` (:func:`false_alarm_budget`; the policy's own run's when ``None``),
    recorded as ``policy["floor_budget"]``, and ``delay_vs_bound``; a delay under the bound's lower
    end sets ``bound_violated`` and leaves the ratio ``null`` (the bound is wrong for that policy).
    ``unreacted``: the scenario's ``round_robin`` run (:func:`oracle_bound`)."""
    from sim.policies import ORACLE_STREAMS

    budget = budget or own_run_budget(policy)
    policy["floor_budget"] = budget
    streams = ORACLE_STREAMS.get(name, ())
    entries = [e for e in policy["faults"] if e["node"] != "all" and (e["group"], e["node"]) in set(scn.faulty)]
    if not entries:
        return
    if not streams:
        for e in entries:
            e["bound_note"] = "the policy reads no per-request or per-node signal"
        return
    rate = budget.get("rate_per_node_hour") or 0.0
    upper = budget.get("upper_per_node_hour") or rate
    if not rate > 0:
        for e in entries:
            e["bound_note"] = "no false-alarm rate to calibrate the oracle to"
        return
    samples = bound_samples(scn, sim, streams)
    base = bound_samples(scn, unreacted, streams) if unreacted is not None else None
    for e in entries:
        gi = _group_index(scn, e["group"])
        f = next(f for f in scn.faults if f.group == e["group"] and f.node == e["node"])
        changes = sim.log.changes.get((gi, e["node"]), [])
        cut = next((ct for ct, cw, cq in changes if ct >= f.start_s and (cw < 0.999 or cq)), None)
        e.update(oracle_bound(scn, samples, streams, gi, e["node"], f.start_s, f.end_s, cut, rate, upper,
                              sim.offset[gi], base))
        det, b, low = e["first_degrade_s"], e.get("bound_s"), e.get("bound_low_s")
        if det is not None and b:
            e["bound_violated"] = bool(low is not None and det < low)
            e["delay_vs_bound"] = None if e["bound_violated"] else _r(det / b)
