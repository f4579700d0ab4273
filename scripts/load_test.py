"""Bounded loopback load benchmark: ingest at a target rate while simulated dashboard users poll.

What it runs (all on 127.0.0.1, all stopped at the end, nothing left behind but the JSON report):

- gunicorn (``--workers 2 --threads 4``) with *production* settings (DEBUG off, a random SECRET_KEY,
  ``SECURE_SSL_REDIRECT=0`` because loopback has no TLS);
- one Celery worker with beat (``--pool solo``): the real control loop, ticking every
  ``TICK_INTERVAL_MS``;
- in this process (asyncio + httpx): gateways POSTing batches of records at ``--rate`` records/s to
  ``--groups`` groups of ``--nodes`` nodes, and ``--users`` dashboard users each polling a page or an
  API read every ``--poll-s`` seconds with a viewer session.

Figures (printed and written to ``--out``): server errors (5xx), records sent/accepted/processed and
lost (accepted - processed, read from the detector state once the streams are drained), latency
percentiles of API reads and pages, tick cadence (intervals between published weights documents),
and CPU (% of one core) and resident memory of the web server and the worker process trees.

Not a test: no assertions. Use a dedicated database and Redis db number (the Redis db is FLUSHed)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_rel_load REDIS_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python scripts/load_test.py --duration 300 --out reports/load-test.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contract import keys  # noqa: E402  (after the path: run as a script from anywhere)
from contract.weights_document import WeightsDocument  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of a process tree."""
    cpu, rss = 0.0, 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / CLK_TCK
            rss += int(fields[21]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):
            continue
    return cpu, rss


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _prepare_database(db_url: str) -> None:
    import psycopg

    name = db_url.rsplit("/", 1)[1]
    admin = db_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    ap.add_argument("--rate", type=int, default=5000, help="records per second ingested")
    ap.add_argument("--batch", type=int, default=500, help="records per POST")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=16, help="nodes per group")
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--poll-s", type=float, default=2.0, help="seconds between one user's requests")
    ap.add_argument("--out", default="reports/load-test.json")
    return ap.parse_args()


def _environment(db_url: str, redis_url: str) -> dict[str, str]:
    """This process's environment with production settings on loopback (no debug, no test mode, a
    random key, no TLS redirect) and a tick every second: what the web server and the worker run with."""
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_DEBUG", "OUTLIER_TESTING"}}
    env.update({
        "DJANGO_SETTINGS_MODULE": "outlier_admin.settings", "DATABASE_URL": db_url, "REDIS_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0", "LOG_LEVEL": "WARNING", "LOG_JSON": "0", "TICK_INTERVAL_MS": "1000",
        "WORKER_METRICS_PORT": "0",
        # The simulated gateways name loopback nodes the first time they send: let them register.
        "AUTO_REGISTER_NODES": "1",
    })
    return env


def _viewer_session() -> str:
    """The key of a logged-in session of the user ``load-viewer`` (role viewer), created as a password
    login would: the dashboard users' cookie."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore

    user, _ = User.objects.get_or_create(username="load-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"  # the password backend
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def _setup(args: argparse.Namespace, redis_url: str) -> tuple[Any, str, str, list[str]]:
    """Django set up on the migrated database; this run's Redis db flushed (a clean stream and state
    for the accounting), an ingest token, a viewer session and ``--groups`` groups that register
    loopback nodes. Returns ``(redis, token, session key, groups)``."""
    import django

    django.setup()
    from contract.topology import redis_from_url
    from outlier_admin.control.actions import do_create_group, do_create_token

    r = redis_from_url(redis_url)
    r.flushdb()  # our own db number: a clean stream/state for the accounting
    _, token = do_create_token(name=f"load-{int(time.time())}", scope="ingest", actor="load-test")
    session_key = _viewer_session()
    run_tag = int(time.time())
    groups = [f"load{run_tag}-{i}" for i in range(args.groups)]
    for g in groups:  # operators create groups; ingest only registers loopback nodes into them
        do_create_group(g, actor="load-test", reason="load test", auto_register_allow=["127.0.0.0/8"])
    return r, token, session_key, groups


def _start(env: dict[str, str], port: int, scratch: Path) -> tuple[subprocess.Popen, subprocess.Popen]:
    """gunicorn (2 workers x 4 threads) on ``port`` and one Celery worker with beat (its schedule in
    ``scratch``): the web server and the control loop under test."""
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "outlier_admin.wsgi", "--workers", "2", "--threads", "4",
         "--worker-class", "gthread", "-b", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=ROOT, env=env,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "outlier_admin", "worker", "--beat", "--pool", "solo",
         "--loglevel", "WARNING", "-s", str(scratch / "beat-schedule")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
    )
    return server, worker


def _stop(procs: tuple[subprocess.Popen, ...]) -> None:
    """SIGTERM to each, then up to 20 s each before a SIGKILL."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    args = _parse_args()
    db_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/oa_rel_load"
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/9"
    env = _environment(db_url, redis_url)
    os.environ.update(env)
    _prepare_database(db_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    r, token, session_key, groups = _setup(args, redis_url)
    from harness.gateways import free_port
    from harness.records import make_records

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    scratch = tempfile.TemporaryDirectory(prefix="load-test-")
    server, worker = _start(env, port, Path(scratch.name))
    try:
        figures = asyncio.run(_load(args, base, token, session_key, groups, r, server.pid, worker.pid,
                                    make_records))
    finally:
        _stop((server, worker))
        scratch.cleanup()  # the beat's schedule shelve (several files)
    print(json.dumps(figures, indent=2))
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


async def _warm_up(base: str, ingest_url: str, headers: dict[str, str], groups: list[str], r: Any, nodes: int,
                   make_records: Callable[..., list[dict]]) -> None:
    """Up to 20 s for ``/healthz``; then two records per node register the groups' nodes, up to 60 s
    for the worker to tick them once (a weights document, an empty stream), and 1.5 s more."""
    import httpx
    import orjson

    async with httpx.AsyncClient(timeout=30) as probe:
        for _ in range(200):
            try:
                if (await probe.get(f"{base}/healthz")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        # Warm-up: register the groups and nodes and let the worker tick them once.
        for g in groups:
            body = orjson.dumps(make_records(time.time(), group=g, nodes=nodes, per_node=2))
            resp = await probe.post(ingest_url, content=body, headers=headers)
            resp.raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            all(r.exists(keys.weights(g)) for g in groups)
            and all(r.xlen(keys.stream(g)) == 0 for g in groups)
        ):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)


def _reads(groups: list[str]) -> list[tuple[str, str]]:
    """What a dashboard user asks for, ``(kind, path)``, one picked at random per request: the API's
    lists, the overview and the audit page, and each group's API view and page."""
    reads = [("api", "/api/v1/groups/"), ("api", "/api/v1/nodes/?limit=100"), ("api", "/api/v1/transitions/?limit=50"),
             ("api", "/api/v1/audit/?limit=50"), ("page", "/"), ("page", "/audit/")]
    for g in groups:
        reads += [("api", f"/api/v1/groups/{g}/"), ("page", f"/groups/{g}/")]
    return reads


async def _user(i: int, base: str, session_key: str, reads: list[tuple[str, str]], stats: dict[str, Any],
                stop_at: float, poll_s: float) -> None:
    """Dashboard user ``i`` (its own seed): a random read every 0.5-1.5 ``poll_s`` until ``stop_at``,
    its time and answer counted in ``stats``."""
    import httpx

    rnd = random.Random(i)
    # Idle connections expire before gunicorn's 2 s keep-alive closes them under us (a browser
    # would silently retry such a request; httpx reports a ReadError).
    limits = httpx.Limits(keepalive_expiry=1.0)
    async with httpx.AsyncClient(base_url=base, timeout=30, cookies={"sessionid": session_key},
                                 limits=limits) as client:
        await asyncio.sleep(rnd.uniform(0, poll_s))
        while time.monotonic() < stop_at:
            kind, path = rnd.choice(reads)
            t = time.perf_counter()
            try:
                resp = await client.get(path)
            except httpx.HTTPError as exc:
                stats["read_other"] += 1
                stats["read_status"][type(exc).__name__] = stats["read_status"].get(type(exc).__name__, 0) + 1
                continue
            ms = (time.perf_counter() - t) * 1000
            stats[f"{kind}_ms"].append(ms)
            stats["by_path"].setdefault(path, []).append(ms)
            stats["reads"] += 1
            if resp.status_code >= 500:
                stats["read_5xx"] += 1
            elif resp.status_code != 200:
                stats["read_other"] += 1
                stats["read_status"][f"{resp.status_code} {path}"] = stats["read_status"].get(
                    f"{resp.status_code} {path}", 0) + 1
            await asyncio.sleep(rnd.uniform(0.5, 1.5) * poll_s)


async def _monitor(r: Any, groups: list[str], stop_at: float, server_pid: int, worker_pid: int,
                   cadence: dict[str, list[tuple[int, float]]], usage: list[tuple[float, float, int, float, int]]
                   ) -> None:
    """Every 0.5 s until ``stop_at``: each new weights document's ``(version, generated_at)`` into
    ``cadence``, and ``(t, web CPU s, web RSS, worker CPU s, worker RSS)`` into ``usage``."""
    while time.monotonic() < stop_at:
        for g in groups:
            raw = r.get(keys.weights(g))
            if raw:
                doc = WeightsDocument.from_json(raw, expected_group=g)
                if not cadence[g] or cadence[g][-1][0] != doc.version:
                    cadence[g].append((doc.version, doc.generated_at))
        s_cpu, s_rss = await asyncio.to_thread(_usage, server_pid)
        w_cpu, w_rss = await asyncio.to_thread(_usage, worker_pid)
        usage.append((time.monotonic(), s_cpu, s_rss, w_cpu, w_rss))
        await asyncio.sleep(0.5)


async def _drain(r: Any, groups: list[str]) -> None:
    """Up to 120 s for every stream to be consumed, then 2.5 s for the tick that acked the last
    entries to store its state (what :func:`_applied` reads)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(r.xlen(keys.stream(g)) == 0 for g in groups):
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.5)  # the tick that acked the last entries has stored its state


async def _load(args: argparse.Namespace, base: str, token: str, session_key: str, groups: list[str], r: Any,
                server_pid: int, worker_pid: int, make_records: Callable[..., list[dict]]) -> dict:
    """The measured run: warm-up, then ``--duration`` s of the gateways (a child process), the
    dashboard users and the monitor at once, the drain, and the figures."""
    ingest_url = f"{base}/api/v1/ingest/requests"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    await _warm_up(base, ingest_url, headers, groups, r, args.nodes, make_records)
    # The accounting starts after the warm-up (the cost model discounts a group's very first samples).
    applied_before = _applied(r, groups)

    stats = {"sent": 0, "accepted": 0, "rejected": 0, "ingest_5xx": 0, "ingest_other": 0,
             "ingest_ms": [], "api_ms": [], "page_ms": [], "read_5xx": 0, "read_other": 0, "reads": 0,
             "read_status": {}, "by_path": {}}
    stop_at = time.monotonic() + args.duration
    reads = _reads(groups)
    cadence: dict[str, list[tuple[int, float]]] = {g: [] for g in groups}
    usage: list[tuple[float, float, int, float, int]] = []

    started = time.monotonic()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    gateways = ctx.Process(target=_gateways, args=(args, ingest_url, headers, groups, args.duration, results))
    gateways.start()
    await asyncio.gather(_monitor(r, groups, stop_at, server_pid, worker_pid, cadence, usage),
                         *(_user(i, base, session_key, reads, stats, stop_at, args.poll_s) for i in range(args.users)))
    gw = await asyncio.to_thread(results.get, True, args.duration + 120)
    gateways.join(timeout=30)
    elapsed = time.monotonic() - started
    for key in ("sent", "accepted", "rejected", "ingest_5xx", "ingest_other", "ingest_ms"):
        stats[key] += gw[key]

    # Drain: wait until every stream is consumed, then read how many samples the detectors applied.
    await _drain(r, groups)
    processed = _applied(r, groups) - applied_before
    return _figures(args, stats, elapsed, processed, cadence, usage, len(groups))


def _figures(args: argparse.Namespace, stats: dict[str, Any], elapsed: float, processed: int,
             cadence: dict[str, list[tuple[int, float]]], usage: list[tuple[float, float, int, float, int]],
             n_groups: int) -> dict:
    """The report: rates, failures, the records' accounting (lost = accepted - processed by the
    ticks), read and ingest latency percentiles, the tick cadence (intervals between the published
    documents' ``generated_at``), CPU over the run as % of one core, and the peak RSS."""
    intervals = []
    for points in cadence.values():
        times = [t for _, t in points]
        intervals += list(np.diff(times))
    t0, s0, _, w0, _ = usage[0]
    t1, s1, _, w1, _ = usage[-1]
    span = max(t1 - t0, 1e-9)
    read_ms = stats["api_ms"] + stats["page_ms"]
    return {
        "duration_s": round(elapsed, 1),
        "target_records_per_s": args.rate,
        "achieved_records_per_s": round(stats["sent"] / elapsed),
        "dashboard_users": args.users,
        "reads": stats["reads"],
        "reads_per_s": round(stats["reads"] / elapsed, 1),
        "server_errors_5xx": stats["ingest_5xx"] + stats["read_5xx"],
        "other_failures": stats["ingest_other"] + stats["read_other"],
        "read_failures_by_status": stats["read_status"],
        "records_sent": stats["sent"],
        "records_accepted": stats["accepted"],
        "records_rejected": stats["rejected"],
        "records_processed_by_ticks": processed,
        "records_lost": stats["accepted"] - processed,
        "api_read_ms_p50": _pct(stats["api_ms"], 50),
        "api_read_ms_p99": _pct(stats["api_ms"], 99),
        "page_ms_p50": _pct(stats["page_ms"], 50),
        "page_ms_p99": _pct(stats["page_ms"], 99),
        "all_reads_ms_p99": _pct(read_ms, 99),
        "read_ms_p50_p99_by_path": {path: [_pct(v, 50), _pct(v, 99)] for path, v in sorted(stats["by_path"].items())},
        "ingest_post_ms_p50": _pct(stats["ingest_ms"], 50),
        "ingest_post_ms_p99": _pct(stats["ingest_ms"], 99),
        "tick_interval_s_p50": _pct(intervals, 50),
        "tick_interval_s_p99": _pct(intervals, 99),
        "tick_interval_s_max": round(float(max(intervals)), 2) if intervals else None,
        "ticks_per_group_per_s": round(len(intervals) / n_groups / elapsed, 2) if intervals else 0,
        "web_cpu_pct_of_one_core": round(100 * (s1 - s0) / span, 1),
        "worker_cpu_pct_of_one_core": round(100 * (w1 - w0) / span, 1),
        "web_rss_mb_max": round(max(u[2] for u in usage) / 2**20, 1),
        "worker_rss_mb_max": round(max(u[4] for u in usage) / 2**20, 1),
        "cpu_count": os.cpu_count(),
        "machine_load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _applied(r, groups: list[str]) -> int:
    """Samples the groups' detectors have applied (sum of the per-node sample counts in Redis)."""
    from detector.group import GroupDetector

    total = 0
    for g in groups:
        raw = r.hget(keys.state(g), "detector")
        if raw:
            total += int(GroupDetector.from_bytes(raw).evaluate(time.time()).counts.sum())
    return total


def _gateways(args, url: str, headers: dict, groups: list[str], duration: float, results) -> None:
    """Child process: POST batches at ``args.rate`` records/s (open loop, on schedule), report counts."""
    import httpx
    import orjson

    from harness.records import make_records

    rng = np.random.default_rng(0)
    stats = {"sent": 0, "accepted": 0, "rejected": 0, "ingest_5xx": 0, "ingest_other": 0, "ingest_ms": []}
    interval = args.batch / args.rate
    per_node = max(args.batch // args.nodes, 1)
    stop_at = time.monotonic() + duration
    next_at = time.monotonic()
    k = 0
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < stop_at:
            g = groups[k % len(groups)]
            k += 1
            recs = make_records(time.time(), group=g, nodes=args.nodes, per_node=per_node, rng=rng)
            t = time.perf_counter()
            try:
                resp = client.post(url, content=orjson.dumps(recs), headers=headers)
            except httpx.HTTPError:
                stats["ingest_other"] += 1
                continue
            stats["ingest_ms"].append((time.perf_counter() - t) * 1000)
            stats["sent"] += len(recs)
            if resp.status_code >= 500:
                stats["ingest_5xx"] += 1
            elif resp.status_code == 200:
                out = resp.json()
                stats["accepted"] += out["accepted"]
                stats["rejected"] += out["rejected"]
            else:
                stats["ingest_other"] += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    results.put(stats)


if __name__ == "__main__":
    main()
