"""Robustness sweep of the detector's tuned constants: which figures hinge on which number.

    python -m bench.sweep --out reports/sweep [--seeds 1] [--scenarios a,b] [--constants x,y]

Runs the simulator's suite (``scenarios/``, ``--quick``, production cadence, the ``default`` policy)
once with every constant at its value and then with each constant at 0.5x and 2x, one at a time,
and writes a table (``sweep.json``, ``sweep.md``): per run, the median first-cut delay and the
median quarantine delay over the faulty nodes that were cut / quarantined (and how many of them
were), the false cuts per 1,000 healthy node-hours (pooled over the scenarios) and the false
quarantines. A materiality (a ratio over 1) is scaled on its excess: 0.5x of 1.15 is 1.075, 2x is
1.3. Integer constants are rounded (at least 1). A benchmark: it prints figures and writes files; it
asserts nothing.

CPU time is bounded by the scenario subset (``--scenarios``, default :data:`SCENARIOS`: the healthy
hour, a surge, a stall, the mild, prefill-only, KV and seed-drill faults) and ``--seeds`` (default 1):
5-10 CPU seconds per scenario and run, ``(1 + 2 x constants) x scenarios`` runs (about half an hour for
the defaults).
Module constants (:mod:`detector.thresholds`) are set in every ``detector`` module that imported
them, in this process only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from detector import thresholds as th

#: Default scenarios: every kind of figure the constants move (false cuts of a healthy hour and of a
#: group-wide surge, a node-wide stall that must not be quarantined, the mildest, the prefill-only and a
#: KV fault, the seed drill).
SCENARIOS = ("healthy-64-long", "surge-16", "periodic-stall-16", "mild-fault-16", "prefill-fault-16", "kv-swap-16",
             "seed-drill-32")
#: The tuned constants: Thresholds fields and module constants of detector.thresholds.
FIELDS = ("degrade_evidence", "evidence_allowance", "degrade_materiality", "prefill_materiality",
          "quarantine_persistence_s", "queue_drain_s", "degrade_exit_dwell_s")
MODULE = ("MAX_FLAP_DOUBLINGS", "STRONG_CUT_SAMPLES", "EXIT_MATERIALITY_FRACTION", "WEIGHT_HALVING_Z",
          "POOL_OBSERVATION_S", "POOL_MAX_STEPS", "COMPARABLE_LOAD_FRACTION", "PREFILL_STALL_S")
FACTORS = (0.5, 2.0)
#: Ratios whose excess over 1 is what is scaled.
RATIOS = ("degrade_materiality", "prefill_materiality")


def scaled(name: str, value: float, factor: float) -> float | int:
    """``value`` at ``factor``: on its excess for a ratio, rounded (at least 1) for an integer."""
    if name in RATIOS:
        return 1.0 + factor * (value - 1.0)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(1, round(value * factor))
    return value * factor


def default_of(name: str) -> float | int:
    return getattr(th.Thresholds(), name) if name in FIELDS else getattr(th, name)


@contextmanager
def module_constant(name: str, value: float | int) -> Iterator[None]:
    """Set ``detector.thresholds.<name>`` and every ``detector`` module's imported copy of it."""
    old = getattr(th, name)
    mods = [m for k, m in list(sys.modules.items())
            if (k == "detector" or k.startswith("detector.")) and getattr(m, name, None) is old]
    for m in mods:
        setattr(m, name, value)
    try:
        yield
    finally:
        for m in mods:
            setattr(m, name, old)


def run_suite(scenarios: list[Any], seeds: int, thresholds: dict[str, Any] | None) -> dict[str, Any]:
    """The ``default`` policy over ``scenarios``: delays of the faulty nodes, false cuts and quarantines."""
    from sim.runner import policy_runs, run_seeds

    cuts: list[float] = []
    quarantines: list[float] = []
    faulty = false_cuts = false_q = 0
    hours = 0.0
    per: dict[str, Any] = {}
    for scn in scenarios:
        rep = run_seeds(scn, ["default"], seeds, options={"thresholds": thresholds} if thresholds else None)
        for r in policy_runs(rep["policies"]["default"]):
            false_cuts += int(r.get("false_degrades") or 0)
            false_q += int(r.get("false_quarantines") or 0)
            hours += float(r.get("healthy_node_hours") or 0.0)
            for f in r["faults"]:
                if f["node"] == "all" or f["kind"] == "warmup":
                    continue
                faulty += 1
                if f.get("first_degrade_s") is not None:
                    cuts.append(float(f["first_degrade_s"]))
                if f.get("quarantine_s") is not None:
                    quarantines.append(float(f["quarantine_s"]))
        p = rep["policies"]["default"]
        per[scn.name] = {"false_degrades": p.get("false_degrades"),
                         "faults": [{k: f.get(k) for k in ("node", "kind", "first_degrade_s", "quarantine_s")}
                                    for f in p["faults"]]}
    return {
        "median_cut_s": round(statistics.median(cuts), 3) if cuts else None,
        "cut": f"{len(cuts)}/{faulty}",
        "median_quarantine_s": round(statistics.median(quarantines), 3) if quarantines else None,
        "quarantined": f"{len(quarantines)}/{faulty}",
        "false_cuts_per_1000h": round(1000.0 * false_cuts / hours, 1) if hours else None,
        "false_cuts": false_cuts,
        "healthy_node_hours": round(hours, 3),
        "false_quarantines": false_q,
        "scenarios": per,
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = ("constant", "factor", "value", "median cut s (cut)", "median quarantine s (quarantined)",
            "false cuts / 1,000 node-h", "false quarantines")
    out = [f"Scenarios: {', '.join(meta['scenarios'])}; seeds {meta['seeds']}; quick, production cadence, "
           f"`default` policy; {meta['cpu_s']:.0f} CPU s.", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
    for r in rows:
        out.append(f"| {r['constant']} | {r['factor']:g} | {r['value']:g} | {r['median_cut_s']} ({r['cut']}) | "
                   f"{r['median_quarantine_s']} ({r['quarantined']}) | {r['false_cuts_per_1000h']} "
                   f"({r['false_cuts']} in {r['healthy_node_hours']:g} node-h) | {r['false_quarantines']} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (sweep.json, sweep.md)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names in scenarios/")
    ap.add_argument("--constants", default=",".join(FIELDS + MODULE))
    ap.add_argument("--dir", default="scenarios")
    args = ap.parse_args(argv)
    from sim.__main__ import PRODUCTION_CADENCE, _quick
    from sim.scenario import load_scenario

    names = [s for s in args.scenarios.split(",") if s]
    constants = [c for c in args.constants.split(",") if c]
    unknown = [c for c in constants if c not in FIELDS + MODULE]
    if unknown:
        ap.error(f"unknown constant(s) {', '.join(unknown)} (known: {', '.join(FIELDS + MODULE)})")
    scenarios = [_quick(load_scenario(Path(args.dir) / f"{n}.json").with_cadence(*PRODUCTION_CADENCE)) for n in names]
    c0 = time.process_time()
    rows: list[dict[str, Any]] = []

    def record(constant: str, factor: float, value: float | int, res: dict[str, Any]) -> None:
        rows.append({"constant": constant, "factor": factor, "value": value, **res})
        r = rows[-1]
        print(f"{constant:26s} x{factor:<4g} = {value:<8g} cut {r['median_cut_s']} ({r['cut']}) "
              f"quarantine {r['median_quarantine_s']} ({r['quarantined']}) "
              f"false cuts/1000h {r['false_cuts_per_1000h']} false q {r['false_quarantines']}", flush=True)

    record("(all at their values)", 1.0, 1, run_suite(scenarios, args.seeds, None))
    for name in constants:
        base = default_of(name)
        for factor in FACTORS:
            value = scaled(name, base, factor)
            if name in FIELDS:
                res = run_suite(scenarios, args.seeds, {name: value})
            else:
                with module_constant(name, value):
                    res = run_suite(scenarios, args.seeds, None)
            record(name, factor, value, res)
    meta = {"scenarios": names, "seeds": args.seeds, "cadence": "production", "quick": True,
            "cpu_s": round(time.process_time() - c0, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "sweep.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
