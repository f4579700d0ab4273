"""Figures of one simulated run (the report's per-policy block).

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
- The delay's parts (:func:`sim.evidence.decompose`, per faulty node): ``to_work_s`` (onset -> the node
  next has work), ``to_evidence_s`` (onset -> the first sample that could show the slowdown: a scrape
  row with tokens decoded after the onset, read only by a policy that reads rows, or an access-log
  line of a request in service after it; ``evidence`` says which), ``to_cut_s`` (= ``first_degrade_s``
  before the safeguard's credit), ``detector_s`` / ``detector_samples`` (first evidence -> cut: **the
  detector's own share**, in seconds and in samples of those kinds), ``to_quarantine_s`` and
  ``cut_to_quarantine_s``. No bound on the detector's delay is computed: the oracle bound this report
  gave before (a CUSUM told the pre- and post-onset histograms) was beaten by the detector in some
  runs, and a bound that is beaten is an estimate.
- A detection made while more than 30 % (the safeguard's fraction) of the group's healthy nodes is out
  of service earns no credit: its ``first_degrade_s`` / ``quarantine_s`` is ``null`` and the fault
  lists it under ``uncredited``.
- ``incidents``: the run's detections per incident for precision and recall (:func:`incidents`: one
  true positive per fault detected, one false positive per healthy node cut at least once).
- ``false_degrades`` / ``false_quarantines``: weight cuts / removals of nodes that are not in
  ``expect.faulty`` (events, not nodes). ``healthy_node_hours``: observation time of those nodes, the
  denominator of a false-alarm rate; ``healthy_out_of_service_node_hours``: how much of it they spent
  removed. The capacity false cuts took (:func:`capacity_taken`): ``healthy_below_base_node_s``, the
  healthy nodes' seconds under their base weight, and ``healthy_weight_s_taken``, the weight they lost
  integrated over time (``1 - w``, 1 out of service: seconds of one node's full share).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detector.states import safeguard_cap
from detector.thresholds import Thresholds
from sim.engine import KIND_CLIENT, STATUS_OK, STATUS_TIMEOUT, Simulation
from sim.evidence import decompose
from sim.scenario import Fault, Scenario

TIMELINE_BIN_S = 5.0
SAFEGUARD_FRACTION = Thresholds().max_quarantine_fraction  # the default every scenario group runs with


def healthy_out(scn: Scenario, sim: Simulation, gi: int, t: float) -> int:
    """How many of group ``gi``'s healthy nodes (not in ``expect.faulty``) are out of service at ``t``."""
    faulty = {n for g, n in faulty_nodes(scn) if g == gi}
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


def faulty_nodes(scn: Scenario) -> set[tuple[int, int]]:
    """``(group index, node)`` of every node in ``expect.faulty`` (the ground truth)."""
    return {(_group_index(scn, g), n) for g, n in scn.faulty}


def policy_report(scn: Scenario, sim: Simulation) -> dict[str, Any]:
    """The per-policy block of the report (schema keys plus documented extras): latency and failures
    per client request, detections per incident, false alarms on healthy nodes and the capacity they
    took, one entry per fault, the P99 timeline."""
    a = sim.attempts()
    client = a["kind"] == KIND_CLIENT
    out = _request_figures(sim, a, client)
    faulty = faulty_nodes(scn)
    false_alarms = _false_alarms(scn, sim, faulty)
    out["incidents"] = incidents(scn, sim)
    out.update(false_alarms)
    out["faults"] = [_fault_entry(scn, sim, f, a, client, faulty) for f in scn.faults]
    out["timeline"] = timeline(sim)
    out["read_progress"] = reads_rows(sim)
    return out


def _request_figures(sim: Simulation, a: dict[str, np.ndarray], client: np.ndarray) -> dict[str, Any]:
    """Latency percentiles per client request (retries and timeouts included), TTFT P99 of the
    answered ones, and the counts of timeouts, 5xx, failed requests, retries and probes (module
    docstring)."""
    gw = a["gw_status"][client]
    lat = client_latency_ms(sim)
    s = sim.summary_arrays()
    ttft = (s["ttft_t"] - np.asarray(sim.r_t)) * 1000.0
    n_att = int(client.sum())
    timeouts = int((gw == STATUS_TIMEOUT).sum())
    return {
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


def _false_alarms(scn: Scenario, sim: Simulation, faulty: set[tuple[int, int]]) -> dict[str, Any]:
    """False alarms and the capacity they took from healthy nodes (not in ``faulty``), each node
    observed from when it joined: cut and removal events, their rates per 1,000 healthy node-hours,
    the hours out of service, the seconds under base weight and the weight-seconds taken
    (:func:`capacity_taken`)."""
    false_deg = false_q = 0
    healthy_hours = 0.0
    oos_hours = below_s = taken_s = 0.0
    join_t = _join_times(scn)
    for gi, g in enumerate(scn.groups):
        for node in range(g.nodes):
            if (gi, node) in faulty:
                continue
            changes = sim.log.changes.get((gi, node), [])
            start = join_t.get((gi, node), 0.0)
            healthy_hours += (scn.duration_s - start) / 3600.0
            false_deg += len(cut_times(changes))
            false_q += len(cut_times(changes, quarantine=True))
            cost = capacity_taken(changes, start, scn.duration_s)
            below_s += cost["below_base_s"]
            taken_s += cost["weight_s"]
            oos_hours += cost["out_s"] / 3600.0
    return {
        "false_degrades": false_deg,
        "false_quarantines": false_q,
        "false_degrades_per_1000h": _r(1000 * false_deg / healthy_hours if healthy_hours else None, 1),
        "false_quarantines_per_1000h": _r(1000 * false_q / healthy_hours if healthy_hours else None, 1),
        "healthy_node_hours": round(healthy_hours, 4),
        "healthy_out_of_service_node_hours": round(oos_hours, 4),
        "healthy_below_base_node_s": round(below_s, 3),
        "healthy_weight_s_taken": round(taken_s, 3),
    }


def _fault_entry(scn: Scenario, sim: Simulation, f: Fault, a: dict[str, np.ndarray], client: np.ndarray,
                 faulty: set[tuple[int, int]]) -> dict[str, Any]:
    """One fault's entry: its first cut and removal after the onset (credited, :func:`over_safeguard`),
    the node's traffic share after detection, its recovery, and for a node of ``expect.faulty``
    where the delay went (:func:`sim.evidence.decompose`). A group-wide fault (``"all"``) has only
    its description."""
    gi = _group_index(scn, f.group)
    entry: dict[str, Any] = {"group": f.group, "node": "all" if f.node is None else f.node, "kind": f.kind,
                             "onset_s": f.start_s, "first_degrade_s": None, "quarantine_s": None,
                             "traffic_share_after_detect": None, "recovery_s": None}
    if f.node is None:
        return entry
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
        entry["traffic_share_after_detect"] = _share_after(sim, a, client, gi, f.node, det, end)
    if f.end_s is not None and det is not None and det < f.end_s:
        entry["recovery_s"] = _recovery_s(changes, f.end_s)
    if (gi, f.node) in faulty:
        entry.update(decompose(f.start_s, **_evidence_samples(sim, gi, f.node, reads_rows(sim)),
                               cut=deg, quarantine=q))
    return entry


def _share_after(sim: Simulation, a: dict[str, np.ndarray], client: np.ndarray, gi: int, local: int,
                 t0: float, t1: float) -> float | None:
    """Node ``local``'s share of group ``gi``'s client attempts from ``t0`` to ``t1``, over its fair
    share (``1 / nodes in the pool``; ``null`` when the group got none)."""
    node_g = np.asarray(sim.node_group)[a["node"][client]]
    in_win = (a["t"][client] >= t0) & (a["t"][client] < t1) & (node_g == gi)
    nodes = np.asarray(sim.node_local)[a["node"][client][in_win]]
    n_group = int(in_win.sum())
    if not n_group:
        return None
    present = sum(sim.members[gi])
    return _r((nodes == local).sum() / (n_group / present))


def _recovery_s(changes: list[tuple[float, float, bool]], end_s: float) -> float | None:
    """Seconds from a fault's end until its node is back at full weight and in service (0 when it
    already is; ``null`` when it never comes back within the run)."""
    w, qq = node_state_at(changes, end_s)
    if w >= 0.999 and not qq:
        return 0.0
    back = next((ct for ct, cw, cq in changes if ct > end_s and cw >= 0.999 and not cq), None)
    return _r(back - end_s if back is not None else None)


def _join_times(scn: Scenario) -> dict[tuple[int, int], float]:
    """When each node added during the run (a ``warmup`` fault) joined its group."""
    return {(_group_index(scn, f.group), f.node): f.start_s for f in scn.faults
            if f.kind == "warmup" and f.node is not None}


def cut_times(changes: list[tuple[float, float, bool]], quarantine: bool = False) -> list[float]:
    """The times a node went from full weight and in service to cut or out (``quarantine``: the
    times it went out of service)."""
    out = []
    prev_w, prev_q = 1.0, False
    for ct, cw, cq in changes:
        if (cq and not prev_q) if quarantine else (prev_w >= 0.999 and not prev_q and (cw < 0.999 or cq)):
            out.append(ct)
        prev_w, prev_q = cw, cq
    return out


def capacity_taken(changes: list[tuple[float, float, bool]], t0: float, t1: float) -> dict[str, float]:
    """What a node's weight changes took from ``t0`` to ``t1``: ``below_base_s``, the seconds it was
    under its base weight (cut or out); ``weight_s``, the integral of the weight taken (``1 - w``,
    1 when out of service), in seconds of one node's full share; ``out_s``, the seconds out."""
    below = taken = out = 0.0
    w, q, t = 1.0, False, t0
    for ct, cw, cq in [*changes, (t1, 1.0, False)]:
        ct = min(max(ct, t0), t1)
        span = ct - t
        if span > 0:
            if q or w < 0.999:
                below += span
            taken += span * (1.0 if q else max(0.0, 1.0 - w))
            out += span if q else 0.0
        t = ct
        if ct >= t1:
            break
        w, q = cw, cq
    return {"below_base_s": below, "weight_s": taken, "out_s": out}


def incidents(scn: Scenario, sim: Simulation) -> dict[str, int]:
    """Detection counted per incident, as an SRE counts it (``runner.detection_quality``):

    - ``faulty``: the faults on a node of ``expect.faulty`` (one incident each); ``detected``: those
      whose node was cut or out at least once from the onset until the fault ended (or the run did),
      held cut at the onset included, a cut made while more than the safeguard's fraction of healthy
      nodes was out left out (:func:`over_safeguard`);
    - ``false_nodes``: the nodes cut at least once while healthy (a node not in ``expect.faulty``, or
      a faulty one before its first onset): one false positive per node and run, however often it
      was cut; ``healthy_nodes``: the nodes that are not in ``expect.faulty``.

    A faulty node cut again after its fault ended (a relapse during recovery) counts neither way."""
    faulty = faulty_nodes(scn)
    onset: dict[tuple[int, int], float] = {}
    found = total = 0
    for f in scn.faults:
        if f.node is None:
            continue
        key = (_group_index(scn, f.group), f.node)
        if key not in faulty:
            continue
        onset[key] = min(onset.get(key, math.inf), f.start_s)
        total += 1
        end = min(f.end_s if f.end_s is not None else scn.duration_s, scn.duration_s)
        changes = sim.log.changes.get(key, [])
        w, q = node_state_at(changes, f.start_s)
        times = [f.start_s] if (w < 0.999 or q) else []
        times += [ct for ct, cw, cq in changes if f.start_s <= ct < end and (cw < 0.999 or cq)]
        if any(not over_safeguard(scn, sim, key[0], t) for t in times):
            found += 1
    false_nodes = 0
    for key, changes in sim.log.changes.items():
        cuts = cut_times(changes)
        if key in faulty:
            cuts = [t for t in cuts if t < onset.get(key, math.inf)]
        false_nodes += bool(cuts)
    nodes = sum(g.nodes for g in scn.groups)
    return {"faulty": total, "detected": found, "false_nodes": false_nodes, "healthy_nodes": nodes - len(faulty)}


def reads_rows(sim: Simulation) -> bool:
    """Whether the run's detecting policy reads the nodes' streamed progress (scrape rows)."""
    return bool(sim.streaming and any(p.wants_progress for p in sim.policies))


def _evidence_samples(sim: Simulation, gi: int, local: int, rows: bool) -> dict[str, Any]:
    """The node's samples for :func:`sim.evidence.decompose`: its attempts' service intervals, its
    access-log lines' times and, when the policy reads them, its scrape rows with decoded tokens
    (``Simulation.log.rows``, taken at the scrape period and phase)."""
    a = sim.attempts()
    mine = a["node"] == sim.offset[gi] + local
    started = mine & np.isfinite(a["start"])
    busy = np.column_stack([a["start"][started], a["end"][started]])
    logged = mine & (a["kind"] == KIND_CLIENT) & (a["gw_status"] >= 0)
    out: dict[str, Any] = {"busy": busy, "lines": a["gw_t"][logged]}
    if rows:
        log = sim.log.rows.get(gi, [])
        out["rows"] = [r[0] for r in log if r[1][local] > 0]
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
