"""A fingerprint of the simulator's output on fixed seeds, to show a refactoring changed no result.

``python scripts/sim_fingerprint.py`` runs a fixed reference set (about a CPU-minute) and prints one
SHA-256 per output and a total; the same total before and after a change means the change left every
figure of those runs byte for byte as it was. ``--keep DIR`` keeps the outputs; ``--hash PATH ...``
only fingerprints report JSON files (or folders of them) that exist already.

The reference set covers what the reports are built from: ``sim suite --quick`` over scenarios with a
KV-cache fault, a group-wide surge, a scale-out (a node that joins) and a two-pool per-request
cluster, under a baseline, the seed's policy and both of ours; ``sim run`` of ``crash-16`` whole (its
fault ends inside the run: recovery) over two seeds (the merge); ``sim fast`` as the command line
runs it, and once more with thresholds that cut healthy nodes (the fast mode's cut, quarantine and
canary paths); and every scenario file of ``scenarios/`` parsed (:func:`sim.scenario.load_scenario`).

What is left out of the hash is time, not results (:data:`TIMING_KEYS`): wall and CPU seconds and the
real-time factors, which differ from run to run. Everything else is hashed as the commands wrote it
(key order included)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Keys whose values are measured time (wall, CPU, real-time factor), dropped wherever they appear.
TIMING_KEYS = frozenset({"speed", "_speed", "wall_s", "total_wall_s", "cpu_s", "calibration_cpu_s",
                         "realtime_factor"})
SUITE_SCENARIOS = ("kv-loss-16", "surge-16", "warmup-scaleout-12", "hetero-two-pools")
SUITE_POLICIES = "round_robin,seed_zscore,default_logs,default"
#: Thresholds under which the fast mode's healthy nodes get cut, quarantined and probed.
HAIR_TRIGGER = {"degrade_z": 0.5, "degrade_materiality": 1.01, "degrade_persistence": 1, "degrade_evidence": 0.5,
                "quarantine_z": 1.0, "quarantine_materiality": 1.01, "quarantine_persistence": 1,
                "quarantine_persistence_s": 0.0, "quarantine_min_evaluations": 1, "max_quarantine_fraction": 1.0}


def without_timing(obj: Any) -> Any:
    """``obj`` with every :data:`TIMING_KEYS` key removed, at any depth (order otherwise kept)."""
    if isinstance(obj, dict):
        return {k: without_timing(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [without_timing(v) for v in obj]
    return obj


def file_hash(path: Path) -> str:
    """SHA-256 of a report JSON file without its timing keys (re-serialised as the simulator writes)."""
    clean = without_timing(json.loads(path.read_text()))
    return hashlib.sha256(json.dumps(clean, indent=1).encode()).hexdigest()


def fingerprint(paths: list[Path]) -> tuple[dict[str, str], str]:
    """Per file (folders expanded to their ``*.json``, sorted) its hash, and one hash over them all."""
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.json")))
    base = os.path.commonpath([str(f.parent) for f in files]) if files else ""
    hashes = {os.path.relpath(f, base): file_hash(f) for f in files}
    total = hashlib.sha256("".join(f"{k} {v}\n" for k, v in hashes.items()).encode()).hexdigest()
    return hashes, total


def _sim(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sim", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def run_reference(out: Path) -> None:
    """Write the reference set's outputs under ``out`` (module docstring)."""
    from sim.fastmode import run_fast
    from sim.scenario import load_scenario

    scn_dir = out / "scenarios"
    scn_dir.mkdir(parents=True)
    for name in SUITE_SCENARIOS:
        shutil.copy(ROOT / "scenarios" / f"{name}.json", scn_dir)
    _sim("suite", str(scn_dir), "--out", str(out / "suite"), "--quick", "--seeds", "1", "--no-plots", "--quiet",
         "--policies", SUITE_POLICIES)
    _sim("run", "scenarios/crash-16.json", "--out", str(out / "crash-16.json"), "--seeds", "2", "--quiet",
         "--policies", "default_logs,default")
    _sim("fast", "--nodes", "16", "--hours", "0.1", "--seed", "1", "--quiet", "--out", str(out / "fast.json"))
    hair = run_fast(nodes=8, hours=0.05, seed=2, thresholds=HAIR_TRIGGER)
    (out / "fast-hair-trigger.json").write_text(json.dumps(hair, indent=1))
    parsed = {}
    for p in sorted((ROOT / "scenarios").rglob("*.json")):
        where = str(p.relative_to(ROOT))  # not the checkout's path: two checkouts give the same hash
        parsed[where] = repr(dataclasses.replace(load_scenario(p), source=where))
    (out / "parsed-scenarios.json").write_text(json.dumps(parsed, indent=1))
    shutil.rmtree(scn_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hash", nargs="+", type=Path, metavar="PATH", help="fingerprint these reports only")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the reference outputs here (new folder)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's sim, whatever else is installed
    if args.hash:
        paths = args.hash
    else:
        out = args.keep or Path(tempfile.mkdtemp(prefix="sim-fingerprint-")) / "out"
        run_reference(out)
        paths = [out]
    hashes, total = fingerprint(paths)
    for name, h in hashes.items():
        print(f"{h}  {name}")
    print(f"{total}  (total)")
    if not args.keep and not args.hash:
        shutil.rmtree(paths[0].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
