"""Robustness sweep of the detector's tuned constants: ``python -m bench.sweep --out DIR [--seeds N]
[--constants x,y] [--healthy-node-hours H]``

Runs the simulator's suite (production cadence, the ``default`` policy) once with every constant at
its value and then with each tuned constant of :mod:`detector.thresholds` at 0.5x and 2x, one at a
time: every operator field the detector's verdict reads (:data:`FIELDS`) and every module constant
with a tuned value (:data:`MODULE`). A materiality (a ratio over 1) is scaled on its excess: 0.5x of
1.15 is 1.075, 2x is 1.3. Integer constants are rounded (at least 1). A value the product refuses
(``quarantine_z`` under ``degrade_z``...) is recorded as refused, with the reason.

Per run, over ``--seeds`` seeds (``seed, seed+1, ...`` of each scenario): the faulty scenarios
(:data:`SCENARIOS`, cut to 60 s after their last onset) give detection per incident (faults detected
/ faults), the median cut and quarantine delays and the median detector's share (first evidence ->
cut, :mod:`sim.evidence`); ``healthy-64-long`` at full fleet for ``--healthy-node-hours`` in all
(split over the seeds; 37 by default, so that a count of 0 has a 95 % Garwood upper end of 100 per
1,000 node-hours) and the faulty scenarios' healthy nodes give the false cuts (nodes cut at least once,
and entries) per 1,000 healthy node-hours with their 95 % intervals, the healthy node-seconds under
base weight per 1,000 node-hours, and the false quarantines. Rows are written to ``sweep.json`` as
they finish (a sweep stopped early keeps what it measured), and a sweep started again on the same
``--out`` with the same settings resumes: the rows already there are kept and not run again (other
settings are refused: ``--fresh`` starts over). ``meta`` names the constants asked for and the runs
planned, so a partial sweep says what it lacks. A benchmark: it prints figures and writes files; it
asserts nothing.

CPU: about 130 s per run at the defaults (the simulation and the detector it drives: a profile finds
no setup, report or JSON worth a second; the fault-free round-robin baseline of ``sim.runner``, which
no figure here reads, is not run: ~140 s with it), measured on the shared two-core host; ``1 + 2 x
constants`` runs (53 for all 26 constants: about 2 CPU hours).
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

#: Default scenarios: every kind of figure the constants move (a group-wide surge, a node-wide stall,
#: the mildest, the prefill-only and a KV fault, the seed drill); the healthy hour comes on top
#: (:data:`HEALTHY`).
SCENARIOS = ("surge-16", "periodic-stall-16", "mild-fault-16", "prefill-fault-16", "kv-swap-16", "seed-drill-32")
#: The healthy fleet whose node-hours resolve the false-cut rate.
HEALTHY = "healthy-64-long"
#: Healthy node-hours per run by default: 3.689 / 37 = 0.0997 per node-hour, the two-sided 95 % upper
#: end of no event, so a run with no false cut shows a rate under 100 per 1,000 node-hours.
HEALTHY_NODE_HOURS = 37.0
#: The tuned constants: Thresholds fields and module constants of detector.thresholds. The first
#: eleven (issue 34) were missing from the sweep of issue 25; they come first.
FIELDS = ("quarantine_materiality", "degrade_z", "quarantine_z", "ema_alpha", "ema_clip", "spread_floor",
          "degrade_persistence", "degrade_evidence", "evidence_allowance", "degrade_materiality",
          "prefill_materiality", "quarantine_persistence_s", "queue_drain_s", "degrade_exit_dwell_s")
MODULE = ("TAIL_PEER_FACTOR", "BATCH_EXTRAPOLATION", "LATENCY_ONLY_CLIP", "ROWS_FRESH_S", "MAX_FLAP_DOUBLINGS",
          "STRONG_CUT_SAMPLES", "EXIT_MATERIALITY_FRACTION", "WEIGHT_HALVING_Z", "POOL_OBSERVATION_S",
          "POOL_MAX_STEPS", "COMPARABLE_LOAD_FRACTION", "PREFILL_STALL_S")
#: The order the sweep runs them in: the constants issue 25's sweep left out first.
ORDER = ("quarantine_materiality", "degrade_z", "quarantine_z", "ema_alpha", "ema_clip", "spread_floor",
         "degrade_persistence", *MODULE[:4], *(c for c in FIELDS[7:]), *MODULE[4:])
FACTORS = (0.5, 2.0)
#: The run of every constant at its value, before the others.
BASELINE = "(all at their values)"
#: What a row's figures depend on besides the constant: a sweep resumes only where these are the same.
SETTINGS = ("scenarios", "healthy", "healthy_node_hours", "healthy_s_per_seed", "seeds", "cadence", "quick")
#: Ratios whose excess over 1 is what is scaled.
RATIOS = ("degrade_materiality", "prefill_materiality", "quarantine_materiality")


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


def refusal(name: str, value: float | int) -> str | None:
    """Why the product refuses ``name = value`` (:class:`detector.thresholds.ThresholdError`), or ``None``."""
    if name not in FIELDS:
        return None
    try:
        th.Thresholds.from_dict({name: value})
    except th.ThresholdError as exc:
        return str(exc)
    return None


def run_suite(scenarios: list[Any], healthy: Any | None, seeds: int, thresholds: dict[str, Any] | None) -> dict[str, Any]:
    """The ``default`` policy over ``scenarios`` and the healthy fleet ``healthy`` (both over ``seeds``
    seeds): detection per incident, delays, false cuts and their cost (module docstring)."""
    from sim.intervals import rate_per_1000h
    from sim.runner import policy_runs, run_seeds

    cuts: list[float] = []
    quarantines: list[float] = []
    shares: list[float] = []
    faults = detected = false_nodes = false_cuts = false_q = 0
    hours = below = 0.0
    per: dict[str, Any] = {}
    options = {"thresholds": thresholds} if thresholds else None
    for scn in [*scenarios, *([healthy] if healthy is not None else [])]:
        rep = run_seeds(scn, ["default"], seeds, options=options, baseline=False)  # only "default" is read
        for r in policy_runs(rep["policies"]["default"]):
            inc = r["incidents"]
            faults += inc["faulty"]
            detected += inc["detected"]
            false_nodes += inc["false_nodes"]
            false_cuts += int(r.get("false_degrades") or 0)
            false_q += int(r.get("false_quarantines") or 0)
            hours += float(r.get("healthy_node_hours") or 0.0)
            below += float(r.get("healthy_below_base_node_s") or 0.0)
            for f in r["faults"]:
                if (f["group"], f["node"]) not in scn.faulty:
                    continue
                for values, key in ((cuts, "first_degrade_s"), (quarantines, "quarantine_s"), (shares, "detector_s")):
                    if f.get(key) is not None:
                        values.append(float(f[key]))
        p = rep["policies"]["default"]
        per[scn.name] = {"false_degrades": p.get("false_degrades"),
                         "faults": [{k: f.get(k) for k in ("node", "kind", "first_degrade_s", "quarantine_s",
                                                           "detector_s")} for f in p["faults"]]}

    def med(v: list[float]) -> float | None:
        return round(statistics.median(v), 3) if v else None

    return {
        "detected": f"{detected}/{faults}", "median_cut_s": med(cuts), "median_quarantine_s": med(quarantines),
        "quarantined": f"{len(quarantines)}/{faults}", "median_detector_s": med(shares),
        "false_cut_nodes": rate_per_1000h(false_nodes, hours), "false_cuts": rate_per_1000h(false_cuts, hours),
        "false_quarantines": false_q, "healthy_node_hours": round(hours, 3),
        "below_base_node_s_per_1000h": round(1000.0 * below / hours, 1) if hours else None,
        "scenarios": per,
    }


def _rate(r: dict[str, Any]) -> str:
    ci = r.get("ci95") or [None, None]
    return f"{r['per_1000h']} [{ci[0]}–{ci[1]}] ({r['events']})"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = ("constant", "factor", "value", "faults detected", "median cut s", "median quarantine s (quarantined)",
            "median detector's share s", "false-cut nodes / 1,000 node-h [95 %] (count)",
            "false cuts / 1,000 node-h [95 %] (count)", "healthy node-s under base / 1,000 node-h",
            "false quarantines")
    out = [f"Scenarios: {', '.join(meta['scenarios'])} (60 s after the last onset) and {meta['healthy']} "
           f"({meta['healthy_node_hours']:g} healthy node-hours per run); seeds {meta['seeds']}; production "
           f"cadence, `default` policy; {meta['cpu_s']:.0f} CPU s for {len(rows)} runs.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("refused"):
            out.append(f"| {r['constant']} | {r['factor']:g} | {r['value']:g} | refused: {r['refused']} |"
                       + " |" * (len(head) - 4))
            continue
        out.append(f"| {r['constant']} | {r['factor']:g} | {r['value']:g} | {r['detected']} | {r['median_cut_s']} | "
                   f"{r['median_quarantine_s']} ({r['quarantined']}) | {r['median_detector_s']} | "
                   f"{_rate(r['false_cut_nodes'])} | {_rate(r['false_cuts'])} | {r['below_base_node_s_per_1000h']} | "
                   f"{r['false_quarantines']} |")
    return "\n".join(out) + "\n"


def earlier(path: Path, meta: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """The rows and CPU seconds of the sweep already in ``path`` (``[], 0`` if none), to resume it;
    ``ValueError`` if it was measured with other :data:`SETTINGS` than ``meta``'s."""
    if not path.exists():
        return [], 0.0
    doc = json.loads(path.read_text())
    differ = [k for k in SETTINGS if doc["meta"].get(k) != meta[k]]
    if differ:
        raise ValueError(f"{path} was measured with other {', '.join(differ)}: --fresh to start over, or another --out")
    print(f"resuming {path}: {len(doc['rows'])} rows kept", flush=True)
    return doc["rows"], float(doc["meta"].get("cpu_s") or 0.0)


def progress_line(r: dict[str, Any]) -> str:
    """One row as the sweep prints it when it finishes."""
    head = f"{r['constant']:26s} x{r['factor']:<4g} = {r['value']:<8g}"
    if r.get("refused"):
        return f"{head} refused: {r['refused']}"
    return (f"{head} detected {r['detected']} cut {r['median_cut_s']} quarantine {r['median_quarantine_s']} "
            f"({r['quarantined']}) share {r['median_detector_s']} false-cut nodes/1000h {_rate(r['false_cut_nodes'])} "
            f"false q {r['false_quarantines']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (sweep.json, sweep.md)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names in scenarios/")
    ap.add_argument("--healthy-node-hours", type=float, default=HEALTHY_NODE_HOURS,
                    help=f"node-hours of {HEALTHY} per run, over all seeds (0: none)")
    ap.add_argument("--constants", default=",".join(ORDER))
    ap.add_argument("--dir", default="scenarios")
    ap.add_argument("--fresh", action="store_true", help="start over: drop the rows of an earlier sweep.json in --out")
    args = ap.parse_args(argv)
    from sim.__main__ import PRODUCTION_CADENCE, _quick
    from sim.scenario import load_scenario

    names = [s for s in args.scenarios.split(",") if s]
    constants = [c for c in args.constants.split(",") if c]
    unknown = [c for c in constants if c not in FIELDS + MODULE]
    if unknown:
        ap.error(f"unknown constant(s) {', '.join(unknown)} (known: {', '.join(FIELDS + MODULE)})")
    scenarios = [_quick(load_scenario(Path(args.dir) / f"{n}.json").with_cadence(*PRODUCTION_CADENCE)) for n in names]
    base = load_scenario(Path(args.dir) / f"{HEALTHY}.json").with_cadence(*PRODUCTION_CADENCE)
    nodes = sum(g.nodes for g in base.groups)
    healthy = base.with_duration(max(1.0, 3600.0 * args.healthy_node_hours / nodes / args.seeds))
    meta: dict[str, Any] = {
        "scenarios": names, "healthy": HEALTHY, "healthy_node_hours": args.healthy_node_hours,
        "healthy_s_per_seed": healthy.duration_s, "seeds": args.seeds, "cadence": "production", "quick": True,
        "constants": constants, "runs_planned": 1 + len(FACTORS) * len(constants), "cpu_s": 0.0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.json"
    try:
        rows, cpu_before = ([], 0.0) if args.fresh else earlier(path, meta)
    except ValueError as exc:
        ap.error(str(exc))
    meta["cpu_s"] = cpu_before
    done = {(r["constant"], r["factor"]) for r in rows}
    c0 = time.process_time()

    def record(constant: str, factor: float, value: float | int, res: dict[str, Any]) -> None:
        rows.append({"constant": constant, "factor": factor, "value": value, **res})
        meta["cpu_s"] = round(cpu_before + time.process_time() - c0, 1)
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(progress_line(rows[-1]), flush=True)

    fleet = healthy if args.healthy_node_hours > 0 else None

    def run(thresholds: dict[str, Any] | None) -> dict[str, Any]:
        return run_suite(scenarios, fleet, args.seeds, thresholds)

    if (BASELINE, 1.0) not in done:
        record(BASELINE, 1.0, 1, run(None))
    for name in constants:
        default = default_of(name)
        for factor in FACTORS:
            if (name, factor) in done:
                continue
            value = scaled(name, default, factor)
            why = refusal(name, value)
            if why:
                record(name, factor, value, {"refused": why})
            elif name in FIELDS:
                record(name, factor, value, run({name: value}))
            else:
                with module_constant(name, value):
                    record(name, factor, value, run(None))
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "sweep.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
