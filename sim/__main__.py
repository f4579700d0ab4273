"""Command line: ``python -m sim {run,suite,fast} ...`` (see ``--help``).

    python -m sim run scenarios/seed-drill-32.json --out reports/seed-drill-32.json --plot reports/seed-drill-32.png
    python -m sim run scenarios/seed-drill-32.json --policies round_robin,default --quick --out /tmp/r.json
    python -m sim suite scenarios --out reports/sim
    python -m sim fast --hours 160 --tick 5 --out reports/sim/fast.json
    python -m sim suite scenarios --out reports/sim --quick --seeds 3 --cadence production
    python -m sim speed scenarios/healthy-64-long.json --duration 120 --out /tmp/speed.json

``--seeds N`` (default 5 for ``run``, 10 for ``suite``) repeats each scenario over N seeds: the
report keeps every run under ``policies[p].runs``, medians in the usual keys, and the table shows the
median with its 90 % interval. ``--cadence production`` is the control plane's defaults (issue 18):
``/metrics`` scraped every 250 ms, a tick on each scrape round's new rows, weights applied at the
gateways 100 ms after the scrape (:data:`PRODUCTION_CADENCE`); ``--cadence beat`` the earlier
beat-driven path (tick, scrape and apply every 1 s); ``scenario`` the scenario's 200 ms tick. ``--quick`` cuts a run to
60 s after its last fault onset (60 s without faults).

Exit status 2 with a one-line message naming the field for a bad scenario file, and at once (before
minutes of simulation) when ``run --plot`` or ``suite`` cannot plot: matplotlib is the ``sim`` extra,
which the demo's venv (``.[demo]``) does not install.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim.policies import ALL_POLICIES, KNOWN_POLICIES
from sim.runner import MINDER, MINDER_NOTE, detection_quality, run_seeds, stderr_progress
from sim.scenario import ScenarioError, load_scenario

QUICK_S = 60.0
TABLE_KEYS = ("p50_ms", "p99_ms", "p999_ms", "ttft_p99_ms", "timeouts", "errors", "false_degrades",
              "false_quarantines", "false_degrades_per_1000h", "false_quarantines_per_1000h")
#: tick, scrape, publish + agent apply (s). Production (issue 18): the scraper reads every node's
#: /metrics every 250 ms (METRICS_SCRAPE_INTERVAL_MS) and the ticker ticks a group as soon as a scrape
#: round's rows are in its stream, so the tick period is the scrape period; from the scrape to the
#: gateway: the tick itself (~30-50 ms, docs/scale.md) and publish + pub/sub + agent apply (bench_e2e:
#: p50 21-42 ms, p99 59-100 ms, agent/README.md): 0.1 s.
PRODUCTION_CADENCE = (0.25, 0.25, 0.1)
#: The beat-driven path before it: a Celery beat tick, scrapes and publishes every 1 s.
BEAT_CADENCE = (1.0, 1.0, 1.0)
CADENCES = {"production": PRODUCTION_CADENCE, "beat": BEAT_CADENCE}


#: What to run when the plotting extra is missing (the message of :func:`require_plotting`).
SIM_EXTRA_HINT = "pip install -e '.[sim]'"


def require_plotting() -> None:
    """Import :mod:`sim.plot` now, or exit 2 naming the ``sim`` extra: the plots are drawn
    after the simulation, so without this a run failed on the import only after minutes of work."""
    try:
        import sim.plot  # noqa: F401 - imported for the check (matplotlib and its backend)
    except ImportError as exc:
        print(f"error: plotting needs matplotlib, the 'sim' extra ({exc}): {SIM_EXTRA_HINT} "
              "(from the repository, in the venv you run this with)", file=sys.stderr)
        raise SystemExit(2) from None


def _policies(arg: str | None) -> list[str]:
    if not arg:
        return list(ALL_POLICIES)
    names = [p.strip() for p in arg.split(",") if p.strip()]
    bad = [p for p in names if p not in KNOWN_POLICIES]
    if bad:
        raise SystemExit(f"error: unknown policy {bad[0]!r} (known: {', '.join(KNOWN_POLICIES)})")
    return names


def _fmt(v: Any, interval: list[float] | None = None) -> str:
    if v is None:
        return "–"
    s = (f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}") if isinstance(v, float) else str(v)
    if interval is not None and interval[0] != interval[1]:
        s += f" [{_fmt(interval[0])}–{_fmt(interval[1])}]"
    return s


def _quick(scn: Any) -> Any:
    onsets = [f.start_s for f in scn.faults]
    return scn.with_duration(min(scn.duration_s, max(QUICK_S, max(onsets, default=0.0) + QUICK_S)))


def _cadence(scn: Any, name: str | None) -> Any:
    if name in CADENCES:
        return scn.with_cadence(*CADENCES[name])
    return scn


def _detected(counts: dict[str, int] | None, runs: int) -> str:
    """Over seeds, how many runs made each detection that not all made: `` (quarantine 1/3 runs)``."""
    shown = {"first_degrade_s": "cut", "quarantine_s": "quarantine"}
    parts = [f"{label} {counts[k]}/{runs}" for k, label in shown.items() if counts and k in counts and runs]
    return f" ({', '.join(parts)} runs)" if parts else ""


def _parts(f: dict[str, Any]) -> str:
    """`` [evidence +0.25 s, detector 0.5 s / 3 samples]``: where the cut's delay went
    (:mod:`sim.evidence`)."""
    if f.get("to_evidence_s") is None:
        return ""
    own = (f"; detector {_fmt(f['detector_s'])} s / {_fmt(f.get('detector_samples'))} samples"
           if f.get("detector_s") is not None else "")
    return f" [evidence +{_fmt(f['to_evidence_s'])} s{own}]"


def markdown_table(report: dict[str, Any]) -> str:
    """One scenario's report as a markdown table (one row per policy, plus the baseline): each
    detection with where its delay went (:mod:`sim.evidence`), and what each policy reads."""
    from sim.policies import POLICY_INPUTS

    head = ["policy", *TABLE_KEYS, "detect (cut/quarantine s [first evidence; detector's share])"]
    lines = [f"### {report['scenario']} ({report['requests']} requests)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    b = report["baseline"]
    lines.append(f"| baseline (no fault) | {_fmt(b['p50_ms'])} | {_fmt(b['p99_ms'])} | {_fmt(b['p999_ms'])} | "
                 f"| {b['timeouts']} | | | | |")
    for name, r in report["policies"].items():
        iv = r.get("interval", {})
        runs = len(r.get("runs", []))
        det = "; ".join(
            f"n{f['node']}:{_fmt(f['first_degrade_s'], f.get('interval', {}).get('first_degrade_s'))}"
            f"/{_fmt(f['quarantine_s'], f.get('interval', {}).get('quarantine_s'))}"
            + _parts(f) + _detected(f.get("detected"), runs)
            for f in r["faults"] if f["node"] != "all" and f["kind"] != "warmup")
        lines.append("| " + " | ".join([name, *(_fmt(r.get(k), iv.get(k)) for k in TABLE_KEYS), det or "–"]) + " |")
    lines += ["", "Inputs: " + "; ".join(f"{name}: {POLICY_INPUTS.get(name, '?')}" for name in report["policies"])]
    return "\n".join(lines) + "\n"


def _ci(d: dict[str, Any], key: str = "value") -> str:
    ci = d.get("ci95")
    return f"{_fmt(d.get(key))}" + (f" [{_fmt(ci[0])}–{_fmt(ci[1])}]" if ci else "")


def detection_quality_table(dq: dict[str, dict[str, Any]]) -> str:
    """The suite's detection quality per policy (:func:`sim.runner.detection_quality`), per incident,
    with 95 % intervals, and what Minder's published figures measure."""
    lines = ["### Detection per incident over the suite", "",
             "| policy | faults detected | healthy nodes cut | precision | recall | F1 | false-cut nodes / 1,000 "
             "node-h | false cuts / 1,000 node-h | false quarantines / 1,000 node-h | healthy node-s under base "
             "weight / 1,000 node-h | weight-s taken / 1,000 node-h | healthy node-h |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in dq.items():
        lines.append(
            f"| {name} | {r['true_positives']}/{r['faults']} | {r['false_positives']} | {_ci(r['precision'])} | "
            f"{_ci(r['recall'])} | {_fmt(r['f1'])} | {_ci(r['false_cut_nodes'], 'per_1000h')} | "
            f"{_ci(r['false_cuts'], 'per_1000h')} | {_ci(r['false_quarantines'], 'per_1000h')} | "
            f"{_fmt(r['below_base_node_s_per_1000h'])} | {_fmt(r['weight_s_taken_per_1000h'])} | "
            f"{_fmt(r['healthy_node_hours'])} |")
    lines += ["", "A fault detected (its node cut or out at least once from the onset to the fault's end) is a "
                  "true positive, one not detected a false negative; a healthy node cut at least once in a run "
                  "one false positive. Intervals: 95 %, Wilson for proportions, Garwood (exact Poisson) for "
                  f"rates. {MINDER_NOTE} (Minder: precision {MINDER['precision']}, F1 {MINDER['f1']}.)"]
    return "\n".join(lines) + "\n"


def _write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in report.items() if not k.startswith("_")}
    out.write_text(json.dumps(clean, indent=1))


def cmd_run(args: argparse.Namespace) -> int:
    if args.plot:
        require_plotting()
    scn = _cadence(load_scenario(args.scenario), args.cadence)
    if args.quick:
        scn = _quick(scn)
    if args.duration:
        scn = scn.with_duration(args.duration)
    report = run_seeds(scn, _policies(args.policies), args.seeds, progress=None if args.quiet else stderr_progress,
                       keep_sims=bool(args.plot))
    _write(report, Path(args.out))
    if args.plot:
        from sim.plot import plot_report

        plot_report(report, report["_sims"], args.plot)
    print(markdown_table(report))
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    if not args.no_plots:
        require_plotting()  # the suite writes a plot per scenario
    files = sorted(Path(args.dir).glob("*.json"))
    if not files:
        print(f"error: no *.json scenario in {args.dir}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenarios = [load_scenario(f) for f in files]  # validate all before spending minutes on the first
    tables = {}
    summary: dict[str, Any] = {}
    all_reports: list[dict[str, Any]] = []
    for scn in scenarios:
        scn = _cadence(scn, args.cadence)
        if args.quick:
            scn = _quick(scn)
        report = run_seeds(scn, _policies(args.policies), args.seeds,
                           progress=None if args.quiet else stderr_progress, keep_sims=not args.no_plots)
        all_reports.append({"scenario": report["scenario"],
                            "policies": {p: {"runs": r.get("runs", [r])} for p, r in report["policies"].items()}})
        _write(report, out / f"{scn.name}.json")
        if not args.no_plots:
            from sim.plot import plot_report

            plot_report(report, report["_sims"], out / f"{scn.name}.png")
        tables[scn.name] = markdown_table(report)
        summary[scn.name] = {name: {k: r.get(k) for k in (*TABLE_KEYS, "faults", "interval")}
                             for name, r in report["policies"].items()}
        summary[scn.name]["_baseline"] = {k: v for k, v in report["baseline"].items() if k != "timeline"}
        summary[scn.name]["_speed"] = report["speed"]
    dq = detection_quality(all_reports, _policies(args.policies))
    summary["_detection_quality"] = {"policies": dq, "minder_nsdi25": MINDER, "minder_note": MINDER_NOTE,
                                     "quick": bool(args.quick), "seeds": args.seeds, "cadence": args.cadence}
    text = [tables[scn.name] for scn in scenarios if scn.name in tables]
    text.append(detection_quality_table(dq))
    (out / "summary.md").write_text("\n".join(text))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(text))
    return 0


def cmd_fast(args: argparse.Namespace) -> int:
    from sim.fastmode import run_fast

    res = run_fast(nodes=args.nodes, hours=args.hours, rate_per_node=args.rate, tick_s=args.tick, seed=args.seed,
                   progress=None if args.quiet else stderr_progress, streams=not args.no_streams)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


def cmd_speed(args: argparse.Namespace) -> int:
    """Simulated seconds per CPU second: the engine alone (``round_robin``) and with the detector
    policies at the scenario's tick and at the production cadence (a benchmark: prints and writes JSON)."""
    import time

    from sim.engine import Precomputed, Simulation
    from sim.policies import policy_factory
    from sim.workload import build_requests

    base = load_scenario(args.scenario).with_duration(args.duration)
    out: dict[str, Any] = {"scenario": base.name, "nodes": sum(g.nodes for g in base.groups), "sim_s": base.duration_s}
    for label, scn, pol in (("round_robin", base, "round_robin"), ("default_logs", base, "default_logs"),
                            (f"default@{base.tick_s:g}s", base, "default"),
                            ("default@production", base.with_cadence(*PRODUCTION_CADENCE), "default")):
        pre = Precomputed.build(scn, build_requests(scn))
        out["requests"] = len(pre.requests)
        c0 = time.process_time()
        Simulation(scn, pre, policy_factory(pol)).run()
        cpu = time.process_time() - c0
        out[label] = {"cpu_s": round(cpu, 2), "realtime_factor": round(scn.duration_s / cpu, 1)}
        print(f"{label}: {out[label]['realtime_factor']}x real time ({cpu:.1f} CPU s)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one scenario with every (or the given) policy")
    r.add_argument("scenario")
    r.add_argument("--policies", help=f"comma-separated subset of {','.join(KNOWN_POLICIES)} "
                                      f"(default: all but {','.join(p for p in KNOWN_POLICIES if p not in ALL_POLICIES)})")
    r.add_argument("--out", required=True, help="report JSON path")
    r.add_argument("--plot", help="PNG path")
    r.add_argument("--quick", action="store_true", help=f"cut the run to {QUICK_S:.0f} s after the last fault onset")
    r.add_argument("--seeds", type=int, default=5, help="runs over seeds seed..seed+N-1 (default 5)")
    r.add_argument("--cadence", choices=("scenario", *CADENCES), default="scenario",
                   help="production: scrape and tick every 250 ms, weights applied 100 ms later; "
                        "beat: tick, scrape and weight apply every 1 s")
    r.add_argument("--duration", type=float, help="override duration_s")
    r.add_argument("--quiet", action="store_true")
    s = sub.add_parser("suite", help="every scenario of a folder: reports, plots and one summary table")
    s.add_argument("dir")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--policies")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--seeds", type=int, default=10, help="runs over seeds seed..seed+N-1 (default 10)")
    s.add_argument("--cadence", choices=("scenario", *CADENCES), default="scenario")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--no-plots", action="store_true", help="reports and tables only (no matplotlib)")
    f = sub.add_parser("fast", help="false quarantines per 1,000 node-hours on healthy samples")
    f.add_argument("--nodes", type=int, default=64)
    f.add_argument("--hours", type=float, default=1.0)
    f.add_argument("--rate", type=float, default=3.0, help="requests/s per node")
    f.add_argument("--tick", type=float, default=1.0, help="detector evaluation period, s")
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--no-streams", action="store_true", help="completed requests only (no streamed progress)")
    f.add_argument("--out")
    f.add_argument("--quiet", action="store_true")
    sp = sub.add_parser("speed", help="simulated seconds per CPU second (engine alone and with the detector)")
    sp.add_argument("scenario")
    sp.add_argument("--duration", type=float, default=120.0)
    sp.add_argument("--out")
    args = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "suite": cmd_suite, "fast": cmd_fast, "speed": cmd_speed}[args.cmd](args)
    except ScenarioError as exc:
        print(f"error: bad scenario: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
