"""A viewer's API latency while one ingest token floods (issue 36, finding 3), through real nginx and gunicorn.

    createdb -h 127.0.0.1 -U postgres oa_flood_bench          # once; the script migrates it
    git worktree add --detach /tmp/before <commit before the change>
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_flood_bench REDIS_URL=redis://127.0.0.1:6379/7 \\
        nice -n 19 .venv/bin/python -m bench.ingest_flood --tree before=/tmp/before --tree after=. \\
        --runs 3 --out reports/bench-ingest-flood.json

For each tree, the web tier as that tree deploys it, on 127.0.0.1: its ``deploy/nginx/nginx.conf`` in a
real nginx, in front of gunicorn with its ``gunicorn_conf`` (2 workers x 4 threads); when the config has
an ingest upstream (``server ingest:8000;``), a second gunicorn for ingest with the process group's
settings of docker-compose.yml (2 workers x 2 threads, ``WEB_NICE=10`` for its CPU weight), else ingest
goes to the one gunicorn. A viewer (a session cookie) asks ``GET /api/v1/groups/`` every
``--interval`` seconds on a fresh connection: ``--probes`` answers idle, then as many while one ingest
token floods with ``--flooders`` threads, each POSTing back to back a body of 99,999 garbage NDJSON
lines (0.19 MiB; ``{}`` then ``x`` lines: the probe's), resending at once whatever the answer (429
included: an attacker does not wait). A run is one idle and one flood phase; runs of the trees are
interleaved (the machine's load drifts alike for both). A phase stops after ``--phase-seconds`` (a stalled
API gives fewer samples; each phase records how many). Per tree: the median over runs of the viewer's
idle P99 and flood P99 (each with its range), their ratio (the goal: <= 2), and the flood's answers by
status. Prints a table and writes JSON; asserts nothing. ``--table REPORT.json`` prints the docs' table
(docs/deploy.md) of a report.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
GROUPS = "/api/v1/groups/"
INGEST = "/api/v1/ingest/requests"
FLOOD_BODY = b"{}\n" + b"x\n" * 99_998  # 99,999 lines, 0.19 MiB: the probe's garbage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_answering(port: int, path: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
            conn.request("GET", path, headers={"Host": "127.0.0.1"})
            if conn.getresponse().status < 500:
                return
        time.sleep(0.3)
    raise RuntimeError(f"127.0.0.1:{port}{path} did not answer within {timeout_s} s")


def setup(database_url: str) -> tuple[str, str]:
    """Migrate, and make a group, a viewer's session and an ingest token: (session id, token)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    os.environ.setdefault("OUTLIER_TESTING", "1")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    from outlier_admin.control.actions import do_create_group, do_create_token, do_register_node
    from outlier_admin.fleet.models import ModelGroup

    if not ModelGroup.objects.filter(name="flood-bench").exists():
        group = do_create_group("flood-bench", actor="bench")
        for i in range(8):
            do_register_node(group, f"127.0.0.{i + 1}:8000", actor="bench")
    viewer = User.objects.filter(username="flood-viewer").first() or User.objects.create_user("flood-viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(viewer)
    _, token = do_create_token(name=f"flood-{time.time_ns()}", scope="ingest", actor="bench")
    return client.cookies["sessionid"].value, token


@contextlib.contextmanager
def gunicorn(tree: Path, log: Path, env: dict[str, str]) -> Iterator[int]:
    port = free_port()
    full = {k: v for k, v in os.environ.items() if k not in ("WEB_CONCURRENCY", "GUNICORN_THREADS", "WEB_NICE",
                                                             "GUNICORN_CMD_ARGS", "PROMETHEUS_MULTIPROC_DIR")}
    full.update({"PORT": str(port), "WEB_BIND": "127.0.0.1", "OUTLIER_TESTING": "1", "LOG_JSON": "0",
                 "LOG_LEVEL": "WARNING", "PYTHONPATH": str(tree), **env})
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:outlier_admin.observability.gunicorn_conf",
                                 "outlier_admin.wsgi:application"], cwd=tree, env=full, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            wait_answering(port, "/healthz")
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@contextlib.contextmanager
def web_tier(tree: Path, workdir: Path) -> Iterator[tuple[int, bool]]:
    """The tree's nginx in front of its gunicorn(s): (nginx's port, whether ingest has its own)."""
    conf = (tree / "deploy" / "nginx" / "nginx.conf").read_text()
    split = "server ingest:8000;" in conf
    with contextlib.ExitStack() as stack:
        web = stack.enter_context(gunicorn(tree, workdir / "web.log", {}))
        ingest = web
        if split:  # docker-compose.yml's ingest service: 2 x 2 threads, a quarter of the CPU weight
            ingest = stack.enter_context(gunicorn(tree, workdir / "ingest.log", {
                "WEB_CONCURRENCY": "2", "GUNICORN_THREADS": "2", "WEB_NICE": "10"}))
        port = free_port()
        conf = (conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
                .replace("server web:8000;", f"server 127.0.0.1:{web};")
                .replace("server ingest:8000;", f"server 127.0.0.1:{ingest};"))
        (workdir / "nginx.conf").write_text(conf)
        out = stack.enter_context((workdir / "nginx.log").open("w"))
        proc = subprocess.Popen([NGINX, "-p", f"{workdir}/", "-e", "stderr", "-c", str(workdir / "nginx.conf"),
                                 "-g", "daemon off;"], stdout=out, stderr=subprocess.STDOUT)
        stack.callback(lambda: (proc.terminate(), proc.wait(10)))
        wait_answering(port, "/healthz")
        yield port, split


def viewer_get(port: int, session: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", GROUPS, headers={"Host": "127.0.0.1", "Cookie": f"sessionid={session}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - t0
    finally:
        conn.close()


def probe(port: int, session: str, count: int, interval_s: float, max_s: float) -> dict[str, Any]:
    """``count`` viewer GETs (fewer if ``max_s`` runs out first: a stalled API)."""
    times, statuses = [], Counter()
    deadline = time.monotonic() + max_s
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        status, took = viewer_get(port, session)
        statuses[status] += 1
        times.append(took)
        time.sleep(interval_s)
    ordered = sorted(times)
    return {"p50_s": statistics.median(ordered), "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max_s": ordered[-1], "samples": len(ordered), "statuses": dict(statuses)}


class Flood:
    """``threads`` threads of one token POSTing :data:`FLOOD_BODY` back to back until stopped."""

    def __init__(self, port: int, token: str, threads: int) -> None:
        self.port, self.token = port, token
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                conn.request("POST", INGEST, body=FLOOD_BODY, headers={
                    "Host": "127.0.0.1", "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/x-ndjson"})
                status = conn.getresponse().status
                conn.close()
            except OSError:
                status = 0
            self.statuses[status] += 1

    def stop(self) -> dict[int, int]:
        self._stop.set()
        for t in self._threads:
            t.join(130)
        return dict(self.statuses)


def one_run(port: int, session: str, token: str, args: argparse.Namespace) -> dict[str, Any]:
    idle = probe(port, session, args.probes, args.interval, args.phase_seconds)
    flood = Flood(port, token, args.flooders)
    time.sleep(2.0)  # the flood is under way
    t0 = time.monotonic()
    loaded = probe(port, session, args.probes, args.interval, args.phase_seconds)
    seconds = time.monotonic() - t0
    answers = flood.stop()
    return {"idle": idle, "flood": loaded, "flood_answers": answers, "flood_seconds": round(seconds, 1)}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def markdown(report: dict[str, Any]) -> str:
    """The docs' table (docs/deploy.md) of a report this script wrote."""
    def ms(d: dict[str, float]) -> str:
        return f"{d['median'] * 1000:.0f} ({d['min'] * 1000:.0f}-{d['max'] * 1000:.0f})"

    rows = ["| tree | layout | runs | viewer idle P99, ms | viewer P99 during the flood, ms | flood / idle | "
            "the flood's answers |", "|---|---|---|---|---|---|---|"]
    for label, s in report["summary"].items():
        r = s["flood_over_idle_p99"]
        answers = ", ".join(f"{n} x {code}" for code, n in sorted(s["flood_answers"].items()))
        rows.append(f"| {label} | {s['layout']} | {s['runs']} | {ms(s['idle_p99_s'])} | {ms(s['flood_p99_s'])} | "
                    f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | {answers} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, metavar="REPORT.json",
                        help="print the docs' table (docs/deploy.md) of a report this script wrote, and exit")
    parser.add_argument("--tree", action="append", metavar="LABEL=PATH",
                        help="a source tree to measure (repeat: before=/tmp/before after=.)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probes", type=int, default=100, help="viewer GETs per phase")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between two viewer GETs")
    parser.add_argument("--phase-seconds", type=float, default=90, help="at most this long per phase")
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL",
                                                                  "postgres://postgres@127.0.0.1:5432/oa_flood_bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return
    if not args.tree:
        parser.error("--tree is required (or --table REPORT.json)")
    trees = dict(t.split("=", 1) for t in args.tree)
    session, token = setup(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    layouts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp, contextlib.ExitStack() as stack:
        tiers = {}
        for label, path in trees.items():
            workdir = Path(tmp) / label
            workdir.mkdir()
            os.chmod(tmp, 0o755)
            os.chmod(workdir, 0o777)  # nginx's worker (nobody, under root) writes its temp files here
            port, split = stack.enter_context(web_tier(Path(path).resolve(), workdir))
            tiers[label] = port
            layouts[label] = "ingest in its own gunicorn" if split else "one gunicorn for everything"
        for run in range(args.runs):
            for label, port in tiers.items():
                result = one_run(port, session, token, args)
                results[label].append(result)
                print(f"run {run + 1} {label:>8}: idle P99 {result['idle']['p99_s'] * 1000:7.1f} ms, flood P99 "
                      f"{result['flood']['p99_s'] * 1000:7.1f} ms, flood answers {result['flood_answers']}", flush=True)
    summary = {}
    for label, runs in results.items():
        idle = [r["idle"]["p99_s"] for r in runs]
        flood = [r["flood"]["p99_s"] for r in runs]
        ratio = [f / i for f, i in zip(flood, idle, strict=True)]
        answers: Counter[str] = Counter()
        for r in runs:
            answers.update({str(k): v for k, v in r["flood_answers"].items()})
        summary[label] = {"layout": layouts[label], "runs": len(runs), "idle_p99_s": spread(idle),
                          "flood_p99_s": spread(flood), "flood_over_idle_p99": spread(ratio),
                          "idle_p50_s": spread([r["idle"]["p50_s"] for r in runs]),
                          "flood_p50_s": spread([r["flood"]["p50_s"] for r in runs]),
                          "flood_answers": dict(answers)}
    print(f"\n{'tree':>8} | {'layout':<28} | {'idle P99 ms (range)':<22} | {'flood P99 ms (range)':<24} | "
          f"{'flood/idle (range)':<20} | flood answers")
    for label, s in summary.items():
        def ms(d: dict[str, float]) -> str:
            return f"{d['median'] * 1000:.0f} ({d['min'] * 1000:.0f}-{d['max'] * 1000:.0f})"

        r = s["flood_over_idle_p99"]
        print(f"{label:>8} | {s['layout']:<28} | {ms(s['idle_p99_s']):<22} | {ms(s['flood_p99_s']):<24} | "
              f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}){'':<6} | {s['flood_answers']}")
    report = {"trees": trees, "runs": args.runs, "probes": args.probes, "interval_s": args.interval,
              "flooders": args.flooders, "flood_body_bytes": len(FLOOD_BODY), "path": GROUPS,
              "summary": summary, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
