"""``python -m bench.drill.matrix``: the routers' matrix (issue 33), every run kept, resumable.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_drill REDIS_URL=redis://127.0.0.1:6383/0 \\
        setsid .venv/bin/python -m bench.drill.matrix --plan quota:0.2 --runs 3 --out docs/drill-matrix.json

A **cell** is ``gateway:weights:fault`` (weights ``off``: the router alone with its own defence, the
control plane running and deciding but nobody applying; ``on``: the agent applies the published
weights to that router; fault ``none``: no fault, the router's floor). Cells run round-robin (the
first run of every cell, then the second...), so a plan cut short still covers every cell; run ``k``
of every cell uses seed ``k``, so the two arms of a router see the same arrivals and prompts.

Every run is appended to ``--out`` as soon as it ends (its figures, configuration, host load, the
router's defence, the faulty node's transitions, the token counters; a failed run as its error), and
the file is rewritten atomically: a plan stopped half way loses nothing. Runs already in the file
count towards ``--runs`` (a plan is resumed by running it again; ``--max-new 1`` in a shell loop
runs each drill in a fresh process, on the tree's code as it is when that run starts). The full result of each run (every
request) goes to ``--raw-dir``. The tables (``python -m bench.drill.tables``) read only ``--out``.

A shared host: the machine's load average is recorded at the start, the onset and the end of each
run. Linux groups the CPU by session (``sched_autogroup``), so ``nice`` inside another session does not
yield to the drill: ``--autogroup-nice`` sets this session's group weight (run under ``setsid`` to
give the drill a group of its own); the value used is recorded with every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Cells of a plan, in the order they are worth running (issue 33, "RUN IT").
PLAN_GATEWAYS = ("nginx-rr", "haproxy", "caddy", "traefik", "envoy", "smg", "vllm-router", "litellm")
#: What a compact run keeps of the drill's result (everything but the requests and the weights' changes).
KEEP = ("config", "group", "host", "source", "faulty", "servers", "gateway", "fault", "figures", "ingest", "wall_s",
        "load_started_at", "token_samples", "probes", "weights_documents_seen")
MAX_RUNS = 20


def cell_key(gateway: str, weights: bool, fault: str) -> str:
    return f"{gateway}:{'on' if weights else 'off'}:{fault}"


def parse_cell(text: str) -> tuple[str, bool, str]:
    gateway, sep, rest = text.partition(":")
    weights, sep2, fault = rest.partition(":")
    if not sep or not sep2 or weights not in ("on", "off") or not fault:
        raise argparse.ArgumentTypeError(f"a cell is GATEWAY:on|off:FAULT (fault 'none' for no fault), got {text!r}")
    return gateway, weights == "on", fault


def plan_cells(faults: list[str], gateways: tuple[str, ...], *, weights: tuple[bool, ...] = (False, True)) -> list[tuple[str, bool, str]]:
    """Every gateway in both arms for each fault, then a no-fault run per gateway (``none`` in faults)."""
    cells = []
    for fault in faults:
        for gw in gateways:
            for w in ((False,) if fault == "none" else weights):
                cells.append((gw, w, fault))
    return cells


def load_matrix(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"benchmark": "routers' matrix: real llama.cpp servers behind each router, alone and with outlier-admin",
            "runs": []}


def save_matrix(path: Path, matrix: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(matrix, indent=1, default=str) + "\n")
    tmp.replace(path)


def compact(result: dict[str, Any]) -> dict[str, Any]:
    out = {k: result[k] for k in KEEP if k in result}
    f = dict(out.get("figures", {}))
    f.pop("states_at_onset", None)
    out["figures"] = f
    return out


def counts(run: dict[str, Any]) -> bool:
    """A run that counts: it ended with figures, and in the router-alone arm no canary probe added
    work to the throttled node (runs before ``canaries`` was recorded probed in both arms)."""
    c = run.get("config", {})
    return "figures" in run and (c.get("weights") or c.get("canaries") is False)


def done_runs(matrix: dict[str, Any], key: str) -> int:
    """Runs of ``key`` that count, and failed ones (a run that fails is not tried again in the same round:
    a cell that cannot run, e.g. an applier missing in this tree, must not hold the plan up)."""
    return sum(1 for r in matrix["runs"] if r.get("cell") == key and (counts(r) or "error" in r))


def backfill_probes(matrix: dict[str, Any], raw_dir: Path) -> int:
    """Runs recorded before the drill kept the canary probes: their probes from PostgreSQL (the
    group's rows outlive the retired group) and the clients' token share from them. Returns how many."""
    from bench.drill.control_plane import ControlPlane
    from bench.drill.report import client_token_share

    n = 0
    for run in matrix["runs"]:
        f = run.get("figures")
        if not f or f.get("faulty_client_token_share_after") is not None or "token_samples" not in run:
            continue
        cp = ControlPlane.__new__(ControlPlane)
        cp.group_name = run["group"]
        probes = cp.probes()
        onset = run["fault"]["onset"]
        if "servers" not in run:
            for raw in raw_dir.glob("*.json"):
                full = json.loads(raw.read_text())
                if full.get("group") == run["group"]:
                    run["servers"] = full["servers"]
                    break
        names = run.get("servers")
        if names is None:
            continue
        f["faulty_client_token_share_after"] = client_token_share(run["token_samples"], run["faulty"]["name"], onset,
                                                                  probes, names)
        f["probe_tokens_faulty_after"] = sum(p["completion_tokens"] or 0 for p in probes
                                             if p["address"] == run["faulty"]["address"] and p["at"] >= onset)
        run["probes"] = probes
        n += 1
    return n


def raw_name(started_at: float, key: str, k: int) -> str:
    """The file of a run's full result in ``--raw-dir``: its start (UTC), cell and run number; a fault's
    ``/`` (``stall:2/10``) becomes ``-``, never a folder (the first stall run's result was lost to it)."""
    cell = key.replace(":", "_").replace("/", "-")
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(started_at))}-{cell}-{k}.json"


def backfill_weight_after_cut(matrix: dict[str, Any], raw_dir: Path) -> int:
    """Runs recorded before the drill kept ``faulty_max_weight_after_cut``: computed from the run's raw
    file (its published documents and transitions), where ``raw_dir`` still has it. Returns how many."""
    from bench.drill.report import is_cut, is_quarantine, max_weight_after_cut

    n = 0
    for run in matrix["runs"]:
        f = run.get("figures")
        if not f or "faulty_max_weight_after_cut" in f:
            continue
        raw = raw_dir / raw_name(run["started_at"], run["cell"], run["run"])
        if not raw.exists():  # a run older than the raw directory: nothing to fill it from
            continue
        full = json.loads(raw.read_text())
        faulty, onset = full["faulty"]["address"], full["fault"]["onset"]
        mine = [t for t in full["transitions"] if t["address"] == faulty and t["at"] >= onset]
        cut = next((t["at"] for t in mine if is_cut(t["to"])), None)
        q = next((t["at"] for t in mine if is_quarantine(t["to"])), None)
        f["faulty_max_weight_after_cut"] = max_weight_after_cut(full["weights_changes"], faulty, cut, q)
        n += 1
    return n


def set_autogroup_nice(value: int | None) -> int | None:
    """This session's CPU group weight (module docstring); returns what it is, ``None`` where unknown."""
    path = Path("/proc/self/autogroup")
    if value is not None:
        try:
            path.write_text(f"{value}\n")
        except OSError as exc:
            print(f"matrix: cannot set the autogroup nice ({exc})", file=sys.stderr)
    try:
        return int(path.read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.drill.matrix", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", action="append", type=parse_cell, default=[], help="GATEWAY:on|off:FAULT (repeatable)")
    ap.add_argument("--plan", action="append", default=[], metavar="FAULT",
                    help="every gateway of --gateways, alone and with outlier-admin, under FAULT ('none': alone only)")
    ap.add_argument("--gateways", default=",".join(PLAN_GATEWAYS))
    ap.add_argument("--arms", choices=("both", "off", "on"), default="both")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell, counting those already in --out")
    ap.add_argument("--rate", type=float, default=1.2)
    ap.add_argument("--onset", type=float, default=60.0)
    ap.add_argument("--after", type=float, default=120.0)
    ap.add_argument("--servers", type=int, default=5)
    ap.add_argument("--autogroup-nice", type=int, default=None, choices=range(-20, 20), metavar="-20..19")
    ap.add_argument("--max-new", type=int, default=None,
                    help="stop after this many new runs (exit 0), exit 3 when the plan is complete: a shell loop "
                         "that starts the matrix again after each run picks up the tree's code as it is then")
    ap.add_argument("--until", default=None, type=_until,
                    help="start no run after this UTC time: YYYY-MM-DDTHH:MM, or HH:MM today")
    ap.add_argument("--out", default="docs/drill-matrix.json")
    ap.add_argument("--raw-dir", default="reports/drill-raw")
    return ap


def _until(text: str) -> datetime:
    """``--until``: a UTC time, a full one or ``HH:MM`` today. A bare hour past midnight would be
    ambiguous to a loop that starts a fresh process every run (``23:10 >= 01:05``): give the date."""
    try:
        if len(text) == 5:
            clock = datetime.strptime(text, "%H:%M")
            return datetime.now(UTC).replace(hour=clock.hour, minute=clock.minute, second=0, microsecond=0)
        return datetime.strptime(text, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not YYYY-MM-DDTHH:MM or HH:MM (UTC)") from None


def _cells(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    """The cells to run, in order: the ``--cell`` s, then :func:`plan_cells` of the ``--plan`` s over
    ``--gateways`` and ``--arms``, less the on-arm of a router this tree has no applier for (said, not
    run). An unknown gateway, or nothing left to run, is a usage error."""
    from bench.drill.gateways import GATEWAYS, has_applier

    gateways = tuple(g for g in args.gateways.split(",") if g)
    unknown = [g for g in gateways + tuple(c[0] for c in args.cell) if g not in GATEWAYS]
    if unknown:
        ap.error(f"unknown gateways {unknown}; one of {GATEWAYS}")
    arms = {"both": (False, True), "off": (False,), "on": (True,)}[args.arms]
    cells = list(args.cell) + plan_cells(args.plan, gateways, weights=arms)
    skipped = [cell_key(*c) for c in cells if c[1] and not has_applier(c[0])]
    if skipped:
        print(f"[matrix] no applier in this tree, not run: {skipped}")
    cells = [c for c in cells if not (c[1] and not has_applier(c[0]))]
    if not cells:
        ap.error("nothing to run: give --cell or --plan")
    return cells


def _run_one(cell: tuple[str, bool, str], k: int, args: argparse.Namespace, out: Path, raw_dir: Path,
             autogroup: int | None) -> None:
    """Run ``k`` of ``cell`` with seed ``k``, appended to ``out`` as soon as it ends (compact, with
    the autogroup nice it ran under; a failed run as its error), its full result in ``raw_dir``."""
    from bench.drill.run import DrillConfig, DrillFailed, DrillUnavailable, format_table, row, run_drill

    gateway, weights, fault = cell
    key = cell_key(gateway, weights, fault)
    cfg = DrillConfig(gateway=gateway, weights=weights, fault=fault, servers=args.servers, rate=args.rate,
                      onset_s=args.onset, after_s=args.after, seed=k)
    print(f"[matrix] {key} run {k} (seed {k}), load {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.time()
    try:
        result = run_drill(cfg)
    except (DrillFailed, DrillUnavailable, TimeoutError, RuntimeError, NotImplementedError, ValueError) as exc:
        print(f"[matrix] {key} run {k} failed: {exc}", flush=True)
        matrix = load_matrix(out)
        matrix["runs"].append({"cell": key, "run": k, "started_at": t0, "error": str(exc)[:3000],
                               "config": {"gateway": gateway, "weights": weights, "fault": fault, "seed": k}})
        save_matrix(out, matrix)
        return
    result["host"]["autogroup_nice"] = autogroup
    matrix = load_matrix(out)  # the figures first: a raw file that cannot be written costs only itself
    matrix["runs"].append({"cell": key, "run": k, "started_at": t0, **compact(result)})
    save_matrix(out, matrix)
    (raw_dir / raw_name(t0, key, k)).write_text(json.dumps(result, default=str))
    print(format_table([row(result)]), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if not 1 <= args.runs <= MAX_RUNS:
        ap.error(f"--runs is 1 to {MAX_RUNS}")
    from bench.drill.control_plane import prepare_database

    cells = _cells(ap, args)
    problem = prepare_database()
    if problem:
        print(problem, file=sys.stderr)
        return 2

    autogroup = set_autogroup_nice(args.autogroup_nice)
    out, raw_dir = Path(args.out), Path(args.raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    matrix = load_matrix(out)
    if backfill_probes(matrix, raw_dir) + backfill_weight_after_cut(matrix, raw_dir):
        save_matrix(out, matrix)
    new = 0
    for k in range(1, args.runs + 1):
        for cell in cells:
            key = cell_key(*cell)
            if done_runs(load_matrix(out), key) >= k:
                continue
            if args.until and datetime.now(UTC) >= args.until:
                print(f"[matrix] {args.until:%Y-%m-%d %H:%M} UTC reached, stopping before {key} run {k}")
                return 3
            if args.max_new is not None and new >= args.max_new:
                return 0
            new += 1
            _run_one(cell, k, args, out, raw_dir, autogroup)
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
