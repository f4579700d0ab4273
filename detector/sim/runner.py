"""Run every policy of a scenario on the same requests and assemble the report (JSON, version 1)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from detector.sim.engine import Precomputed, Simulation
from detector.sim.policies import ALL_POLICIES, policy_factory
from detector.sim.report import add_floor_ratios, cusum_bounds, policy_report, signal_quality
from detector.sim.scenario import Scenario
from detector.sim.workload import build_requests

Progress = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_scenario(scn: Scenario, policies: Sequence[str] = ALL_POLICIES, *,
                 progress: Progress | None = None, options: dict[str, Any] | None = None,
                 keep_sims: bool = False) -> dict[str, Any]:
    """Simulate ``policies`` (plus the fault-free ``round_robin`` baseline) and build the report.

    The requests, node speeds and per-request noise are drawn once and shared by every policy.
    With ``keep_sims`` the :class:`Simulation` objects are returned under ``"_sims"`` (for plots).
    """
    for p in policies:
        if p not in ALL_POLICIES:
            raise ValueError(f"unknown policy {p!r} (known: {', '.join(ALL_POLICIES)})")
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
        add_floor_ratios(scn, sims[name], report["policies"][name], report["cusum_bound"])
    report["speed"] = {"wall_s": {k: round(v, 2) for k, v in timing.items()},
                       "realtime_factor": {k: round(scn.duration_s / v, 1) for k, v in timing.items() if v > 0},
                       "total_wall_s": round(time.perf_counter() - t0, 2)}
    if keep_sims:
        report["_sims"] = sims
    return report
