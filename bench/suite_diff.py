"""Two simulator suites side by side: what a detector change did to each scenario's figures.

    python -m sim suite scenarios --out BEFORE --quick --seeds 10 --cadence production --policies default
    (change the detector)
    python -m sim suite scenarios --out AFTER --quick --seeds 10 --cadence production --policies default
    python -m bench.suite_diff BEFORE AFTER --out reports/suite-diff.json > reports/suite-diff.md

Per scenario and faulty node: the median cut and quarantine delay over the seeds **with how many runs
made it** (a median over the runs that detected is not comparable with one over all of them: one run
in three quarantining at 1.8 s reads "1.8 s" in the suite's table), the median detector's share (first
evidence -> cut, :mod:`sim.evidence`), and the false cuts and quarantines per 1,000 healthy
node-hours; then detection per incident over the whole suite (:func:`sim.runner.detection_quality`).
The JSON holds the same figures. A suite folder from before issue 34 has neither the detector's share
nor per-incident counts: those cells read "–".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sim.runner import policy_runs

POLICY = "default"


def scenario_figures(report: dict[str, Any], policy: str = POLICY) -> dict[str, Any]:
    """One scenario report's figures (see the module docstring)."""
    runs = policy_runs(report["policies"][policy])
    faults: dict[str, dict[str, Any]] = {}
    for run in runs:
        for f in run.get("faults", []):
            node = f["node"]
            key = f"{'n' if isinstance(node, int) else ''}{node} ({f['kind']})"
            entry = faults.setdefault(key, {"cut": [], "quarantine": [], "detector": []})
            for name, field in (("cut", "first_degrade_s"), ("quarantine", "quarantine_s"),
                                ("detector", "detector_s")):
                if f.get(field) is not None:
                    entry[name].append(float(f[field]))
    p = report["policies"][policy]
    return {
        "runs": len(runs),
        "false_cuts_per_1000h": p.get("false_degrades_per_1000h"),
        "false_quarantines_per_1000h": p.get("false_quarantines_per_1000h"),
        "faults": {key: {name: {"median": round(statistics.median(v), 3) if v else None, "runs": len(v)}
                         for name, v in entry.items()} for key, entry in faults.items()},
    }


def suite_figures(folder: Path, policy: str = POLICY) -> dict[str, Any]:
    """Every scenario of one ``sim suite`` folder, and its precision/recall."""
    summary = json.loads((folder / "summary.json").read_text())
    scenarios = {}
    for name in sorted(k for k in summary if not k.startswith("_")):
        path = folder / f"{name}.json"
        if path.exists():
            scenarios[name] = scenario_figures(json.loads(path.read_text()), policy)
    dq = summary.get("_detection_quality", {}).get("policies", {}).get(policy)
    return {"folder": str(folder), "scenarios": scenarios, "detection_quality": dq}


def _delay(d: dict[str, Any] | None, runs: int) -> str:
    if not d or d["median"] is None:
        return "–"
    return f"{d['median']}" + ("" if d["runs"] == runs else f" ({d['runs']}/{runs} runs)")


def _ci(d: dict[str, Any] | None, key: str = "value") -> str:
    if not d or d.get(key) is None:
        return "–"
    ci = d.get("ci95")
    return f"{d[key]}" + (f" [{ci[0]}–{ci[1]}]" if ci else "")


#: The rows of the per-incident table: label, and the cell from a policy's ``detection_quality``.
QUALITY_ROWS = (
    ("faults detected", lambda q: f"{q['true_positives']}/{q['faults']}"),
    ("healthy nodes cut (false positives)", lambda q: q["false_positives"]),
    ("precision [95 %]", lambda q: _ci(q["precision"])),
    ("recall [95 %]", lambda q: _ci(q["recall"])),
    ("F1", lambda q: q["f1"]),
    ("false-cut nodes / 1,000 healthy node-h [95 %]", lambda q: _ci(q["false_cut_nodes"], "per_1000h")),
    ("false cuts / 1,000 healthy node-h [95 %]", lambda q: _ci(q["false_cuts"], "per_1000h")),
    ("false quarantines / 1,000 healthy node-h [95 %]", lambda q: _ci(q["false_quarantines"], "per_1000h")),
    ("healthy node-s under base weight / 1,000 node-h", lambda q: q["below_base_node_s_per_1000h"]),
    ("weight-s taken / 1,000 node-h", lambda q: q["weight_s_taken_per_1000h"]),
    ("healthy node-hours", lambda q: q["healthy_node_hours"]),
)


def _pair(a: Any, b: Any) -> str:
    return f"{'–' if a is None else a} → {'–' if b is None else b}"


def markdown(before: dict[str, Any], after: dict[str, Any]) -> str:
    lines = ["| scenario | faulty node | cut s | quarantine s | detector's share s | false cuts / 1,000 node-h | "
             "false quarantines / 1,000 node-h |", "|---|---|---|---|---|---|---|"]
    for name in sorted(set(before["scenarios"]) | set(after["scenarios"])):
        b, a = before["scenarios"].get(name), after["scenarios"].get(name)
        if b is None or a is None:
            lines.append(f"| {name} | only in {'after' if b is None else 'before'} | | | | | |")
            continue
        keys = sorted(set(b["faults"]) | set(a["faults"])) or ["–"]
        for i, key in enumerate(keys):
            fb, fa = b["faults"].get(key, {}), a["faults"].get(key, {})
            cells = [_pair(_delay(fb.get(m), b["runs"]), _delay(fa.get(m), a["runs"])) if key != "–" else "–"
                     for m in ("cut", "quarantine")]
            share = _pair((fb.get("detector") or {}).get("median"), (fa.get("detector") or {}).get("median")) \
                if key != "–" else "–"
            rates = [_pair(b[k], a[k]) for k in ("false_cuts_per_1000h", "false_quarantines_per_1000h")] \
                if i == 0 else ["", ""]
            lines.append(f"| {name if i == 0 else ''} | {key} | {cells[0]} | {cells[1]} | {share} | "
                         f"{rates[0]} | {rates[1]} |")
    qb, qa = before.get("detection_quality") or {}, after.get("detection_quality") or {}
    lines += ["", "| per incident over the suite | before | after |", "|---|---|---|"]
    for label, get in QUALITY_ROWS:
        lines.append(f"| {label} | {get(qb) if qb else '–'} | {get(qa) if qa else '–'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.suite_diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--policy", default=POLICY)
    ap.add_argument("--out", type=Path, help="write both suites' figures as JSON")
    args = ap.parse_args(argv)
    for folder in (args.before, args.after):
        if not (folder / "summary.json").is_file():
            print(f"error: {folder} has no summary.json (a `python -m sim suite` folder)", file=sys.stderr)
            return 2
    before, after = suite_figures(args.before, args.policy), suite_figures(args.after, args.policy)
    print(markdown(before, after), end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"before": before, "after": after}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
