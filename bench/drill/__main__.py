"""``python -m bench.drill``: the real-engine drill (see :mod:`bench.drill.run`).

    createdb -h 127.0.0.1 -U postgres oa_drill        # or let the drill create it
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_drill REDIS_URL=redis://127.0.0.1:6379/12 \\
        .venv/bin/python -m bench.drill --gateway nginx-rr --weights on --fault quota:0.2 \\
        --servers 5 --rate 1.2 --onset 60 --after 120 --out reports/drill.json
    ... --matrix --out reports/drill-matrix.json     # every gateway, weights off and on

Runs ``migrate`` on that database first. Creates a group ``drill-<hex>`` and retires it at the end
(and any live ``drill-*`` group an earlier run left). Prints a table and writes the JSON (figures,
transitions, published weights changes and every request). Not a test: no assertions; the exit
status is 0 when the drill ran, 2 when this host cannot run it, 1 when a part of it died.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.drill.gateways import GATEWAYS


def _threshold(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--threshold takes NAME=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.drill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", choices=GATEWAYS, default="nginx-rr")
    p.add_argument("--weights", choices=("on", "off"), default="on",
                   help="on: the agent applies the published weights; off: the control plane decides, nobody applies")
    p.add_argument("--fault", default="quota:0.2", help="quota:FRACTION | stall:BURST_S/EVERY_S | drift:FRACTION/OVER_S")
    p.add_argument("--servers", type=int, default=5)
    p.add_argument("--faulty", default=None, help="engine that gets the fault (s0..; default the last)")
    p.add_argument("--rate", type=float, default=1.2, help="Poisson arrivals per second")
    p.add_argument("--onset", type=float, default=60.0, help="seconds of load before the fault")
    p.add_argument("--after", type=float, default=120.0, help="seconds of load after the onset")
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout (s); counted as a timeout")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threshold", action="append", type=_threshold, default=[], metavar="NAME=VALUE",
                   help="a group threshold for the drill's group (repeatable; default: the product's defaults)")
    p.add_argument("--tick-ms", type=int, default=None, help="TICK_INTERVAL_MS of the worker (default: settings)")
    p.add_argument("--matrix", action="store_true", help="every gateway, weights off then on")
    p.add_argument("--keep-workdir", action="store_true", help="keep configs and logs of the processes")
    p.add_argument("--out", default="reports/drill.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bench.drill.control_plane import prepare_database

    problem = prepare_database()
    if problem:
        print(problem, file=sys.stderr)
        return 2

    from bench.drill.run import (
        DrillConfig,
        DrillFailed,
        DrillUnavailable,
        format_table,
        row,
        run_drill,
        run_matrix,
        unavailable_reason,
        write_report,
    )

    cfg = DrillConfig(gateway=args.gateway, weights=args.weights == "on", fault=args.fault, servers=args.servers,
                      rate=args.rate, onset_s=args.onset, after_s=args.after, seed=args.seed, timeout_s=args.timeout,
                      faulty=args.faulty, thresholds=dict(args.threshold), tick_ms=args.tick_ms,
                      keep_workdir=args.keep_workdir)
    try:
        reason = unavailable_reason(cfg)
    except ValueError as exc:
        print(f"drill: {exc}", file=sys.stderr)
        return 2
    if reason:
        print(f"drill: cannot run here: {reason}", file=sys.stderr)
        return 2
    t0 = time.time()
    report: dict[str, Any] = {"benchmark": "real-engine drill (llama.cpp servers, real gateway, real control plane)",
                              "argv": sys.argv[1:] if argv is None else list(argv), "started_at": t0}
    try:
        runs = run_matrix(cfg) if args.matrix else [run_drill(cfg)]
    except DrillUnavailable as exc:
        print(f"drill: cannot run here: {exc}", file=sys.stderr)
        return 2
    except DrillFailed as exc:
        print(f"drill: {exc}", file=sys.stderr)
        return 1
    rows = [row(r) for r in runs if "figures" in r]
    report.update(runs=runs, table=rows, wall_s=round(time.time() - t0, 1))
    path = write_report(report, args.out)
    print(format_table(rows))
    for r in runs:
        if "error" in r:
            print(f"failed: {r['config']['gateway']} weights {'on' if r['config']['weights'] else 'off'}: "
                  f"{r['error'][:300]}")
    print(f"wrote {path}")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
