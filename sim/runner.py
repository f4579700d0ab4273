"""Run every policy of a scenario on the same requests and assemble the report (JSON, version 1).

:func:`run_seeds` repeats a scenario over ``N`` seeds (``seed, seed+1, ...``: new requests, node
speeds, tick phase): every run's per-policy block is kept under ``policies[p].runs``, today's keys hold
the median over the runs (over the runs where it is not ``null``, for detection delays) and
``interval`` the 5th-95th percentiles (a 90 % interval); ``detected`` counts the runs with a value."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.engine import Precomputed, Simulation
from sim.intervals import proportion, rate_per_1000h
from sim.policies import ALL_POLICIES, KNOWN_POLICIES, policy_factory
from sim.report import policy_report, signal_quality
from sim.scenario import Scenario
from sim.workload import build_requests

SEED_SKIP = ("timeline", "runs", "interval", "faults", "detected", "node", "onset_s", "seed")

Progress = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_scenario(scn: Scenario, policies: Sequence[str] = ALL_POLICIES, *,
                 progress: Progress | None = None, options: dict[str, Any] | None = None,
                 keep_sims: bool = False, baseline: bool = True) -> dict[str, Any]:
    """Simulate ``policies`` (plus the fault-free ``round_robin`` baseline) and build the report.

    The requests, node speeds and per-request noise are drawn once and shared by every policy.
    With ``keep_sims`` the :class:`Simulation` objects are returned under ``"_sims"`` (for plots).
    ``baseline=False`` leaves out the baseline run and what is read from it (``baseline``,
    ``signal_quality``): each policy's simulation draws from its own seeded generators, so its block
    is the same without it, and a caller that reads only the policies (``bench.sweep``) saves a run.
    """
    for p in policies:
        if p not in KNOWN_POLICIES:
            raise ValueError(f"unknown policy {p!r} (known: {', '.join(KNOWN_POLICIES)})")
    t0 = time.perf_counter()
    requests = build_requests(scn)
    pre = Precomputed.build(scn, requests)
    report: dict[str, Any] = {"version": 1, "scenario": scn.name, "requests": len(requests),
                              "duration_s": scn.duration_s, "policies": {}}
    sims: dict[str, Simulation] = {}
    timing: dict[str, float] = {}

    def one(name: str, s: Scenario) -> Simulation:
        def tick(t: float) -> None:
            if progress is not None:
                progress(f"[{scn.name}] {name}: {t:.0f}/{s.duration_s:.0f} s simulated")

        start = time.perf_counter()
        sim = Simulation(s, pre, policy_factory(name, options), progress=tick if progress else None).run()
        timing[name] = time.perf_counter() - start
        return sim

    if baseline:
        base = one("round_robin", scn.without_faults())
        sims["baseline"] = base
        b = policy_report(scn.without_faults(), base)
        report["baseline"] = {"p50_ms": b["p50_ms"], "p99_ms": b["p99_ms"], "p999_ms": b["p999_ms"],
                              "timeout_rate": b["timeout_rate"], "timeouts": b["timeouts"],
                              "timeline": b["timeline"]}
        report["signal_quality"] = signal_quality(scn, base)
        timing["baseline"] = timing.pop("round_robin")
    for name in policies:
        sim = one(name, scn)
        sims[name] = sim
        report["policies"][name] = policy_report(scn, sim)
        if progress:
            r = report["policies"][name]
            progress(f"[{scn.name}] {name}: p99 {r['p99_ms']} ms, timeouts {r['timeouts']}, "
                     f"{timing[name]:.1f} s wall")
    report["speed"] = {"wall_s": {k: round(v, 2) for k, v in timing.items()},
                       "realtime_factor": {k: round(scn.duration_s / v, 1) for k, v in timing.items() if v > 0},
                       "total_wall_s": round(time.perf_counter() - t0, 2)}
    if keep_sims:
        report["_sims"] = sims
    return report


def _merge(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric key over ``blocks`` (``null`` values left out), 90 % interval and count."""
    out: dict[str, Any] = dict(blocks[0])
    interval: dict[str, list[float]] = {}
    detected: dict[str, int] = {}
    for k, v0 in blocks[0].items():
        if k in SEED_SKIP or isinstance(v0, (dict, list, str, bool)):
            continue
        vals = [b.get(k) for b in blocks]
        nums = [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        if not nums:
            out[k] = None
            continue
        out[k] = round(float(np.median(nums)), 3)
        interval[k] = [round(float(np.percentile(nums, 5)), 3), round(float(np.percentile(nums, 95)), 3)]
        if any(v is None for v in vals):
            detected[k] = len(nums)
    out["interval"] = interval
    if detected:
        out["detected"] = detected
    return out


def run_seeds(scn: Scenario, policies: Sequence[str] = ALL_POLICIES, seeds: int = 5, *,
              progress: Progress | None = None, options: dict[str, Any] | None = None,
              keep_sims: bool = False, baseline: bool = True) -> dict[str, Any]:
    """:func:`run_scenario` over ``seeds`` seeds, merged (module docstring). ``seeds == 1`` is one run."""
    reports = [run_scenario(scn.with_seed(scn.seed + i), policies, progress=progress, options=options,
                            keep_sims=keep_sims and i == 0, baseline=baseline) for i in range(seeds)]
    if seeds == 1:
        return reports[0]
    out = dict(reports[0])
    out["seeds"] = [scn.seed + i for i in range(seeds)]
    for name in policies:
        blocks = [r["policies"][name] for r in reports]
        merged = _merge(blocks)
        merged["faults"] = [_merge([b["faults"][i] for b in blocks]) for i in range(len(blocks[0]["faults"]))]
        merged["runs"] = [{k: v for k, v in b.items() if k != "timeline"} for b in blocks]
        out["policies"][name] = merged
    if baseline:
        out["baseline"] = _merge([r["baseline"] for r in reports])
    out["speed"] = {"total_wall_s": round(sum(r["speed"]["total_wall_s"] for r in reports), 2),
                    "runs": [r["speed"] for r in reports]}
    return out


def policy_runs(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A policy's runs in a report: one per seed (``runs``, as :func:`run_seeds` merges them), or the
    policy's block itself when the report is of one run."""
    return block.get("runs") or [block]


#: Minder (NSDI '25), faulty-machine detection in production training clusters: its published
#: precision and F1. Not the same kind of figure as :func:`detection_quality`'s (:data:`MINDER_NOTE`).
MINDER = {"precision": 0.904, "f1": 0.893}
#: Why the two are not set side by side as one measurement.
MINDER_NOTE = ("Minder's precision and F1 (NSDI '25) are per incident on production training clusters: "
               "real faults as operators later confirmed them, on machines of one training job that run "
               "the same step in lockstep; ours are per injected fault and healthy node in simulated "
               "inference groups, on scenarios whose faults and ground truth we wrote: a different "
               "population, fault mix and ground truth, so the numbers are not the same kind.")


def detection_quality(reports: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per policy, over every run (every seed) of every scenario in ``reports``, counted per incident
    (:func:`sim.report.incidents`): a fault on a node of ``expect.faulty`` detected (cut or out at least
    once from its onset to its end) is a true positive, one not detected a false negative; a healthy node
    cut at least once in a run is one false positive. ``precision = TP / (TP + FP)``, ``recall = TP /
    faults``, ``f1`` their harmonic mean, the first two with 95 % Wilson intervals; the false cuts (events
    and nodes) and false quarantines per 1,000 healthy node-hours with 95 % Garwood intervals; and the
    capacity the false cuts took: healthy node-seconds under base weight and weight-seconds taken per
    1,000 healthy node-hours (:func:`sim.report.capacity_taken`). ``null`` where a denominator is 0."""
    out: dict[str, dict[str, Any]] = {}
    for p in policies:
        runs = [run for r in reports if p in r["policies"] for run in policy_runs(r["policies"][p])]
        inc = [x["incidents"] for x in runs if "incidents" in x]
        tp = sum(i["detected"] for i in inc)
        faults = sum(i["faulty"] for i in inc)
        fp = sum(i["false_nodes"] for i in inc)
        hours = sum(float(x.get("healthy_node_hours") or 0.0) for x in runs)
        prec, rec = proportion(tp, tp + fp), proportion(tp, faults)
        pv, rv = prec["value"], rec["value"]
        f1 = 2 * pv * rv / (pv + rv) if pv is not None and rv is not None and pv + rv > 0 else None
        below = sum(float(x.get("healthy_below_base_node_s") or 0.0) for x in runs)
        taken = sum(float(x.get("healthy_weight_s_taken") or 0.0) for x in runs)
        out[p] = {
            "true_positives": tp, "false_positives": fp, "faults": faults, "false_negatives": faults - tp,
            "precision": prec, "recall": rec, "f1": None if f1 is None else round(f1, 4),
            "healthy_node_hours": round(hours, 3),
            "false_cut_nodes": rate_per_1000h(fp, hours),
            "false_cuts": rate_per_1000h(sum(int(x.get("false_degrades") or 0) for x in runs), hours),
            "false_quarantines": rate_per_1000h(sum(int(x.get("false_quarantines") or 0) for x in runs), hours),
            "below_base_node_s_per_1000h": round(1000.0 * below / hours, 2) if hours else None,
            "weight_s_taken_per_1000h": round(1000.0 * taken / hours, 2) if hours else None,
            "runs": len(runs),
        }
    return out
