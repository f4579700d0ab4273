"""Ingest memory per request (issue 29 finding 3): the probe's body, ``{}`` then ``x`` N times, NDJSON.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_bench REDIS_URL=redis://127.0.0.1:6379/7 \\
        .venv/bin/python -m bench.ingest_memory --lines 100000 500000 --out reports/bench-ingest-memory.json

Every line of that body is refused (``missing_ts`` once, ``bad_json`` N times): the probe found each
refused line cost ~2.7 KB of worker memory and one stored row (N = 500,000: 0.95 MiB of body, 1,465
MiB of RSS, 33.5 s). Each N runs in a fresh process (``ru_maxrss`` is a high-water mark) that
migrates the database, builds the body, then POSTs it once through Django's test client to
``/api/v1/ingest/requests``; it reports the status, the time of the request, the process's peak RSS
over its level before the request (MiB, and bytes per body byte), and the rows and refusals stored.
``--max-lines`` sets ``INGEST_MAX_LINES`` (default: above N, so the body is taken and the per-line
path is measured; ``0``: the setting as configured, under which a body over the cap is a 413).
Prints and writes JSON; asserts nothing (``tests/reliability/test_ingest_memory.py`` asserts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def probe_body(lines: int, line: bytes = b"x") -> bytes:
    """The probe's body: one JSON object without the required fields, then ``lines`` lines of ``x``
    (or of ``line``: ``{}`` is a line that parses, and is refused by validation)."""
    return b"{}\n" + line + b"\n" + (line + b"\n") * (lines - 1)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(lines: int, *, max_lines: int | None, line: str = "x") -> dict[str, Any]:
    """One POST of the probe's body with ``lines`` bad lines, in this process (call it in a fresh one)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    os.environ.setdefault("OUTLIER_TESTING", "1")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    from outlier_admin.control.actions import do_create_token
    from outlier_admin.ingest.models import RejectedInput

    if max_lines is not None:
        settings.INGEST_MAX_LINES = max_lines
    settings.ALLOWED_HOSTS = ["*"]
    name = f"membench-{os.getpid()}-{time.time_ns()}"  # its own source: its own rows and row budget
    _, token = do_create_token(name=name, scope="ingest", actor="bench")
    body = probe_body(lines, line.encode())
    client = Client()
    before = _rss_mib()
    t0 = time.perf_counter()
    resp = client.post("/api/v1/ingest/requests", data=body, content_type="application/x-ndjson",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    elapsed = time.perf_counter() - t0
    peak = _rss_mib()
    counted = any(f.name == "count" for f in RejectedInput._meta.fields)  # absent before issue 29
    mine = RejectedInput.objects.filter(source=f"http:{name}")
    rows = list(mine.values_list("count", flat=True)) if counted else [1] * mine.count()
    out = resp.json()
    return {
        "lines": lines + 1, "line": line, "body_bytes": len(body), "max_lines": getattr(settings, "INGEST_MAX_LINES", None),
        "status": resp.status_code, "seconds": round(elapsed, 3), "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(peak, 1), "rss_growth_mib": round(peak - before, 1),
        "growth_bytes_per_body_byte": round((peak - before) * 2**20 / len(body), 1),
        "rejected": out.get("rejected"), "rows_stored": len(rows), "refusals_stored": sum(rows),
    }


def run(lines: list[int], *, max_lines: int | None, line: str = "x", python: str = sys.executable,
        cwd: str | None = None) -> list[dict[str, Any]]:
    """:func:`measure` for each N, each in its own process (``cwd``: the tree whose code runs)."""
    results = []
    for n in lines:
        cap = None if max_lines == 0 else (max_lines or n + 10)
        code = ("import json, sys; from bench.ingest_memory import measure;"
                f"print(json.dumps(measure({n}, max_lines={cap!r}, line={line!r})))")
        proc = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "PYTHONPATH": cwd or os.getcwd()})
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[100_000, 500_000])
    parser.add_argument("--max-lines", type=int, default=None,
                        help="INGEST_MAX_LINES for the run (default: above N; 0: as configured)")
    parser.add_argument("--line", default="x", help="the repeated line (x: not JSON; {}: JSON, refused)")
    parser.add_argument("--tree", default=None, help="run the code of this source tree (a before/after)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = run(args.lines, max_lines=args.max_lines, line=args.line, cwd=args.tree)
    for r in results:
        print(f"N={r['lines']:>8,} of {r['line']!r} body {r['body_bytes'] / 2**20:5.2f} MiB  status {r['status']}  "
              f"{r['seconds']:6.2f} s  RSS +{r['rss_growth_mib']:7.1f} MiB "
              f"({r['growth_bytes_per_body_byte']:7.1f} B/body byte)  rejected {r['rejected']}  "
              f"rows {r['rows_stored']} (refusals {r['refusals_stored']})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tree": args.tree or os.getcwd(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
