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
from sim.policies import ALL_POLICIES, KNOWN_POLICIES, policy_factory
from sim.report import (
    add_bounds,
    cusum_bounds,
    false_alarm_budget,
    own_run_budget,
    policy_report,
    signal_quality,
)
from sim.scenario import Scenario
from sim.workload import build_requests

SEED_SKIP = ("timeline", "runs", "interval", "faults", "detected", "node", "onset_s", "seed")

Progress = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_scenario(scn: Scenario, policies: Sequence[str] = ALL_POLICIES, *,
                 progress: Progress | None = None, options: dict[str, Any] | None = None,
                 keep_sims: bool = False, budgets: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Simulate ``policies`` (plus the fault-free ``round_robin`` baseline) and build the report.

    The requests, node speeds and per-request noise are drawn once and shared by every policy.
    With ``keep_sims`` the :class:`Simulation` objects are returned under ``"_sims"`` (for plots).
    Each policy's oracle bound is calibrated to its false-alarm rate: ``budgets[policy]`` (from the healthy
    runs of a suite, :func:`healthy_budgets`), else the one its own run measured on its healthy nodes.
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
    rr = sims.get("round_robin") or one("round_robin", scn)
    report["cusum_bound"] = cusum_bounds(scn, rr)
    for name in policies:
        block = report["policies"][name]
        budget = (budgets or {}).get(name) or own_run_budget(block)
        add_bounds(scn, sims[name], name, block, budget, unreacted=rr)
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
              keep_sims: bool = False, budgets: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`run_scenario` over ``seeds`` seeds, merged (module docstring). ``seeds == 1`` is one run.
    Without ``budgets`` each run's bounds use that run's own false-alarm budget (kept per run); the
    merged ``floor_budget`` then pools every run's false cuts and healthy node-hours."""
    reports = [run_scenario(scn.with_seed(scn.seed + i), policies, progress=progress, options=options,
                            keep_sims=keep_sims and i == 0, budgets=budgets) for i in range(seeds)]
    if seeds == 1:
        return reports[0]
    out = dict(reports[0])
    out["seeds"] = [scn.seed + i for i in range(seeds)]
    for name in policies:
        blocks = [r["policies"][name] for r in reports]
        merged = _merge(blocks)
        merged["faults"] = [_merge([b["faults"][i] for b in blocks]) for i in range(len(blocks[0]["faults"]))]
        for i, f in enumerate(merged["faults"]):
            f["bound_violated"] = sum(bool(b["faults"][i].get("bound_violated")) for b in blocks)
        merged["runs"] = [{k: v for k, v in b.items() if k != "timeline"} for b in blocks]
        if not (budgets or {}).get(name):
            merged["floor_budget"] = false_alarm_budget(
                sum(b.get("false_degrades", 0) for b in blocks), sum(b.get("healthy_node_hours", 0.0) for b in blocks),
                "each run's own healthy nodes (pooled here)")
        out["policies"][name] = merged
    out["baseline"] = _merge([r["baseline"] for r in reports])
    out["cusum_bound"] = [_merge([r["cusum_bound"][i] for r in reports]) for i in range(len(reports[0]["cusum_bound"]))]
    out["speed"] = {"total_wall_s": round(sum(r["speed"]["total_wall_s"] for r in reports), 2),
                    "runs": [r["speed"] for r in reports]}
    return out


def policy_runs(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A policy's runs in a report: one per seed (``runs``, as :func:`run_seeds` merges them), or the
    policy's block itself when the report is of one run."""
    return block.get("runs") or [block]


def healthy_budgets(reports: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each policy's false-alarm budget from the healthy runs of a suite (``reports``: scenarios with
    no faulty node, e.g. ``healthy-64-long``, ``periodic-stall-16``): its false cuts and its healthy
    node-hours pooled over every run (every seed) of them, and the 95 % upper bound of the rate
    (:func:`sim.report.false_alarm_budget`)."""
    names = ", ".join(r["scenario"] for r in reports)
    out = {}
    for p in policies:
        runs = [run for r in reports if p in r["policies"] for run in policy_runs(r["policies"][p])]
        if runs:
            out[p] = false_alarm_budget(sum(x.get("false_degrades", 0) for x in runs),
                                        sum(x.get("healthy_node_hours", 0.0) for x in runs), f"healthy runs: {names}")
    return out


#: Minder (NSDI '25), faulty-machine detection in production training clusters: its published
#: precision and F1, the reference the suite's precision and recall are printed next to.
MINDER = {"precision": 0.904, "f1": 0.893}


def precision_recall(reports: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per policy, over every run (every seed) of every scenario in ``reports``: cut events on a
    faulty node at or after its onset are true positives, every other cut event a false positive
    (``report.cut_counts``); a faulty node never cut in a run is a false negative. ``precision =
    TP / (TP + FP)`` over cut events, ``recall`` = faulty nodes cut / faulty nodes, ``f1`` their
    harmonic mean; ``null`` where a denominator is 0."""
    out: dict[str, dict[str, Any]] = {}
    for p in policies:
        runs = [run for r in reports if p in r["policies"] for run in policy_runs(r["policies"][p])]
        tp = sum(x["cuts"]["true"] for x in runs if "cuts" in x)
        fp = sum(x["cuts"]["false"] for x in runs if "cuts" in x)
        faulty = sum(x["cuts"]["faulty_nodes"] for x in runs if "cuts" in x)
        found = sum(x["cuts"]["faulty_nodes_cut"] for x in runs if "cuts" in x)
        prec = tp / (tp + fp) if tp + fp else None
        rec = found / faulty if faulty else None
        f1 = 2 * prec * rec / (prec + rec) if prec is not None and rec is not None and prec + rec > 0 else None
        out[p] = {"true_cuts": tp, "false_cuts": fp, "faulty_nodes": faulty, "faulty_nodes_cut": found,
                  "false_negatives": faulty - found, "precision": None if prec is None else round(prec, 4),
                  "recall": None if rec is None else round(rec, 4), "f1": None if f1 is None else round(f1, 4),
                  "runs": len(runs)}
    return out
