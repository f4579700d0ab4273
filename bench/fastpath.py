"""Fast-path benchmark (issue 18): tick cost, groups held per worker process, ingest, end-to-end drill.

Run against real services with a dedicated database and Redis db (it creates groups named ``fp-*``
and FLUSHes nothing)::

    DJANGO_DEBUG=1 DATABASE_URL=postgres://postgres@127.0.0.1:5432/outlier_admin_hd1 \\
        REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python -m bench.fastpath \\
        --out reports/bench-fastpath.json

Sections (``--only tick,scale,ingest,drill,scrape`` picks some):

- ``tick``: one group of 10 / 100 / 1,000 nodes fed 2 requests/s per node, ticked once per simulated
  second; ``tick_ms`` percentiles of :func:`outlier_admin.control.tick.run_tick` (the whole tick:
  lock, state, stream, detector, publish, SQL);
- ``scale``: G groups x 100 nodes ticked by 1, 2 and 4 worker processes (the event-driven loop of
  :mod:`outlier_admin.control.scheduling`), fed at 2 requests/s per node; the most groups held at
  1 Hz with lag p99 (stream write -> tick that applied it) under a second; 1,000 x 100 on paper;
- ``ingest``: records posted over HTTP (gunicorn, 2 workers) as fast as two clients go, through the
  stream and the ticks; records accepted, applied, lost (:func:`bench_ingest`);
- ``scrape``: nodes scraped at 4 Hz per process, from the model-server scraper's hook
  (:data:`SCRAPE_BENCH_HOOK`).

- ``drill``: fault onset -> weight cut / quarantine in the weights document (:func:`contract.keys.weights`), end to end at the
  production defaults (HTTP scrapes by ``scrape_metrics``, event-driven ``run_ticker``), 10 onsets
  (:func:`bench_drill`).

Not a test: prints figures and writes JSON, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if values else float("nan")


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    import django

    django.setup()


def _group(name: str, nodes: int) -> Any:
    """A fresh group ``name`` with ``nodes`` nodes on 127.0.0.1 (through the actions, audited)."""
    from outlier_admin.control.actions import do_create_group, do_register_nodes_from_ingest
    from outlier_admin.fleet.models import ModelGroup

    group = do_create_group(name, actor="bench", reason="fast-path benchmark")
    ids = [f"127.0.0.1:{10000 + i}" for i in range(nodes)]
    for start in range(0, nodes, 500):
        do_register_nodes_from_ingest(group, ids[start:start + 500], actor="bench")
    return ModelGroup.objects.get(pk=group.pk)


def _records(group: str, nodes: int, t: float, rate: float, rng: np.random.Generator,
             slow: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """``rate`` requests per node over the second before ``t``; latency (p*0.25 + c) * 20 ms."""
    slow = slow or {}
    per = max(int(rate), 1)
    n = nodes * per
    idx = np.repeat(np.arange(nodes), per)
    p = rng.integers(50, 2000, n)
    c = rng.integers(20, 400, n)
    noise = rng.lognormal(0.0, 0.08, n)
    factor = np.array([slow.get(int(i), 1.0) for i in idx])
    total = (p * 0.25 + c) * 20.0 * noise * factor
    ts = t - rng.uniform(0, 1.0, n)
    return [{"ts": float(ts[k]), "node": f"127.0.0.1:{10000 + int(idx[k])}", "group": group,
             "prompt_tokens": int(p[k]), "completion_tokens": int(c[k]), "ttft_ms": float(total[k] * 0.3),
             "total_ms": float(total[k]), "status": 200} for k in range(n)]


def _submit(records: list[dict[str, Any]], now: float) -> int:
    from outlier_admin.ingest.pipeline import submit

    return submit(((i, rec, None) for i, rec in enumerate(records)), source="bench", now=now).accepted


def bench_tick(sizes: tuple[int, ...] = (10, 100, 1000), ticks: int = 40, rate: float = 2.0) -> dict[str, Any]:
    """Per-group tick cost at each size: ``ticks`` ticks, one per simulated second (after 5 warm-up).
    ``p50``/``p95``: wall time of :func:`run_tick`; ``cpu_p50``: this process's CPU time in it (the
    machine is shared: wall time includes waiting for a core, CPU time does not)."""
    from outlier_admin.control.tick import run_tick

    out: dict[str, Any] = {}
    rng = np.random.default_rng(1)
    stamp = int(time.time())
    for nodes in sizes:
        group = _group(f"fp-tick-{nodes}-{stamp}", nodes)
        t0 = time.time()
        wall, cpu = [], []
        n = ticks if nodes <= 100 else max(ticks // 3, 10)
        for k in range(n + 5):
            t = t0 + k
            _submit(_records(group.name, nodes, t, rate, rng), now=t)
            c0 = time.process_time()
            res = run_tick(group.name, now=t)
            c1 = time.process_time()
            if k >= 5 and res is not None:
                wall.append(res.tick_ms)
                cpu.append((c1 - c0) * 1000.0)
        out[str(nodes)] = {"p50": _pct(wall, 50), "p95": _pct(wall, 95), "cpu_p50": _pct(cpu, 50),
                           "cpu_p95": _pct(cpu, 95), "ticks": len(wall)}
        print(f"tick {nodes:>5} nodes: wall p50 {out[str(nodes)]['p50']} ms p95 {out[str(nodes)]['p95']} ms, "
              f"cpu p50 {out[str(nodes)]['cpu_p50']} ms", flush=True)
    return out


def bench_evaluate(nodes: int = 100, rounds: int = 30) -> float:
    """CPU ms of the detector's own ``evaluate`` at ``nodes`` (no I/O): the machine's yardstick. The
    issue measured 0.6 ms on an idle core; the ratio says how much slower this run's core was."""
    from detector.group import GroupDetector
    from detector.samples import SampleBatch

    gd = GroupDetector(now=0.0)
    for i in range(nodes):
        gd.add_node(f"n{i}", base_weight=100.0, now=0.0, warm=True)
    rng = np.random.default_rng(0)
    cpu = []
    for k in range(rounds):
        n = 2 * nodes
        p, c = rng.integers(50, 2000, n), rng.integers(20, 400, n)
        total = (p * 0.25 + c) * 20.0 * rng.lognormal(0, 0.08, n)
        gd.ingest(SampleBatch.from_columns(
            node=[f"n{i % nodes}" for i in range(n)], ts=np.full(n, k + 0.5), prompt_tokens=p, completion_tokens=c,
            ttft_ms=total * 0.3, total_ms=total, status=np.full(n, 200)))
        c0 = time.process_time()
        gd.evaluate(k + 1.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return _pct(cpu[5:], 50)


def _ticker_proc(ticker_id: str, groups: list[str], stop: Any, queue: Any) -> None:
    """A worker process: one :class:`Ticker` over ``groups`` until ``stop``; reports each tick's end
    time, group, wall time and lag, and the process's CPU time."""
    _setup()
    from outlier_admin.control.redis_conn import get_redis
    from outlier_admin.control.scheduling import Ticker
    from outlier_admin.control.tick import run_tick

    ticks: list[tuple[float, str, float, float | None]] = []

    def tick(name: str, consumer: str) -> Any:
        res = run_tick(name, consumer=consumer)
        if res is not None:
            ticks.append((time.time(), name, res.tick_ms, res.lag_ms if res.entries else None))
        return res

    c0 = time.process_time()
    Ticker(ticker_id, get_redis(), tick=tick, list_groups=lambda: groups).run(stop)
    queue.put({"ticks": ticks, "cpu_s": time.process_time() - c0})


def bench_scale(workers: tuple[int, ...] = (1, 2, 4), group_counts: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128),
                nodes: int = 100, seconds: float = 12.0, rate: float = 2.0) -> dict[str, Any]:
    """Groups x ``nodes`` held at the default cadence (1 Hz heartbeat, ticks on new rows) by 1, 2, 4
    ticker processes; rows written once per second per group (``rate`` requests/s per node) for
    ``seconds`` once every process has registered (its start-up is not counted). A count is held when
    every group got >= 0.9 ticks/s and the lag p99 (row written -> the tick that applied it
    published) stayed under 1 s; the largest held count is reported per process count."""
    import multiprocessing as mp

    from django.db import connections

    from outlier_admin.control.redis_conn import get_redis
    from outlier_admin.control.scheduling import TICKERS_KEY, tickers_alive

    stamp = int(time.time())
    all_groups = [_group(f"fp-scale-{stamp}-{i}", nodes).name for i in range(max(group_counts))]
    rng = np.random.default_rng(2)
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    r = get_redis()
    for p in workers:
        held = None
        trials = []
        for g in group_counts:
            groups = all_groups[:g]
            r.delete(TICKERS_KEY)
            connections.close_all()
            queue, stop = ctx.Queue(), ctx.Event()
            procs = [ctx.Process(target=_ticker_proc, args=(f"bench-{p}-{i}", groups, stop, queue))
                     for i in range(p)]
            for proc in procs:
                proc.start()
            deadline = time.time() + 120
            while len(tickers_alive(r)) < p and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # their first ticks (state restored, groups taken)
            fed_from = time.time()
            while time.time() - fed_from < seconds:
                t = time.time()
                for name in groups:
                    _submit(_records(name, nodes, t, rate, rng), now=t)
                time.sleep(max(1.0 - (time.time() - t), 0.0))
            fed_to = time.time()
            stop.set()
            results = [queue.get(timeout=120) for _ in procs]
            for proc in procs:
                proc.join(timeout=30)
            window = [t for res in results for t in res["ticks"] if fed_from + 1.0 <= t[0] <= fed_to]
            lag = [t[3] for t in window if t[3] is not None]
            per_group = {name: 0 for name in groups}
            for t in window:
                per_group[t[1]] += 1
            min_rate = min(per_group.values()) / max(fed_to - fed_from - 1.0, 1.0)
            trial = {"groups": g, "nodes": nodes, "lag_p50_ms": _pct(lag, 50), "lag_p99_ms": _pct(lag, 99),
                     "tick_ms_p50": _pct([t[2] for t in window], 50), "min_ticks_per_s": round(min_rate, 2),
                     "cpu_s_per_process": [round(res["cpu_s"], 1) for res in results]}
            ok = min_rate >= 0.9 and bool(lag) and trial["lag_p99_ms"] < 1000
            trial["held"] = bool(ok)
            trials.append(trial)
            print(f"scale {p} proc x {g:>3} groups x {nodes} nodes: lag p50 {trial['lag_p50_ms']} p99 "
                  f"{trial['lag_p99_ms']} ms, min {trial['min_ticks_per_s']} ticks/s, held={ok}", flush=True)
            if not ok:
                break
            held = g
        out[str(p)] = {"groups_held": held, "nodes_per_group": nodes, "trials": trials}
    return out


def bench_ingest(seconds: float = 20.0, batch: int = 5000, nodes: int = 100, posters: int = 2) -> dict[str, Any]:
    """HTTP -> stream -> tick: ``posters`` threads post ``batch``-record JSON bodies to gunicorn (2 sync
    workers) for ``seconds`` while this process ticks the group (:func:`run_tick`, the fast path);
    then ticks until the stream is drained. ``lost`` = records accepted - samples the detector applied
    (``accepted_total``, checkpoint + replay). Target (issue 18): 50,000 records/s, 0 lost."""
    import socket
    import subprocess
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import httpx
    import orjson

    from outlier_admin.control import tick
    from outlier_admin.control.actions import do_create_token
    from outlier_admin.control.redis_conn import get_redis

    group = _group(f"fp-ingest-{int(time.time())}", nodes)
    _, token = do_create_token(name=f"fp-ingest-{int(time.time())}", scope="ingest", actor="bench")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "outlier_admin.wsgi", "-w", "2", "-b",
                               f"127.0.0.1:{port}", "--log-level", "warning"], cwd=Path(__file__).resolve().parent.parent)
    url = f"http://127.0.0.1:{port}/api/v1/ingest/requests"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    rng = np.random.default_rng(5)
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(200):
                try:
                    client.get(url)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
        bodies = [orjson.dumps(_records(group.name, nodes, time.time(), batch / nodes, rng)[:batch]) for _ in range(8)]
        r = get_redis()
        tick.run_tick(group.name)
        base = tick._load_detector(r, group, time.time())[0].accepted_total
        accepted, errors, lock = [0], [0], threading.Lock()
        stop = time.monotonic() + seconds

        def post(k: int) -> None:
            with httpx.Client(timeout=60) as c:
                i = k
                while time.monotonic() < stop:
                    resp = c.post(url, content=bodies[i % len(bodies)], headers=headers)
                    i += posters
                    with lock:
                        if resp.status_code == 200:
                            accepted[0] += resp.json()["accepted"]
                        else:
                            errors[0] += 1

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=posters) as pool:
            futures = [pool.submit(post, k) for k in range(posters)]
            while not all(f.done() for f in futures):
                if not (res := tick.run_tick(group.name)) or not res.entries:
                    time.sleep(0.05)
            for f in futures:
                f.result()
        posted_s = time.monotonic() - started
        while (res := tick.run_tick(group.name)) is not None and res.entries:
            pass
        drained_s = time.monotonic() - started
        applied = tick._load_detector(r, group, time.time())[0].accepted_total - base
    finally:
        server.terminate()
        server.wait(timeout=10)
    out = {"records_accepted": accepted[0], "records_applied": int(applied), "lost": int(accepted[0] - applied),
           "http_errors": errors[0], "records_per_s_http": round(accepted[0] / posted_s),
           "records_per_s_through_ticks": round(applied / drained_s), "batch": batch, "nodes": nodes}
    print(f"ingest: {out['records_per_s_http']} records/s over HTTP, {out['records_per_s_through_ticks']} through "
          f"ticks, lost {out['lost']}", flush=True)
    return out


class _EnginePages:
    """Model-server ``/metrics`` of simulated nodes as the simulator's vLLM V1 step engines render
    them (:mod:`sim.vllm`, :meth:`sim.metrics.EngineMetrics.render`): ``groups`` groups of ``nodes``
    h100 tp8 engines serving the Azure LLM 2023 conversation trace at ``rate_per_node`` requests/s
    per node (round robin), one :class:`sim.engine.Simulation` advanced to the wall clock at every
    scrape. A fault is the scenario's ``thermal_throttle`` of node 3 of group ``k`` from
    ``onsets_s[k]`` on (output tokens/s at equal load divided by ``slow``, ``scenarios/SCHEMA.md``):
    it starts at its instant, mid-interval, requests already running slow from there, and the batch,
    the prompt mix and the step jitter are the engine's, not a constant."""

    def __init__(self, groups: int, nodes: int, onsets_s: list[float], slow: float, rate_per_node: float = 2.0,
                 seed: int = 7) -> None:
        import threading

        from sim.engine import Precomputed, Simulation
        from sim.policies import policy_factory
        from sim.scenario import parse_scenario
        from sim.workload import build_requests

        names = [f"g{k}" for k in range(groups)]
        doc = {
            "name": "bench-fastpath-drill", "seed": seed, "duration_s": max(onsets_s, default=0.0) + 120.0,
            "groups": [{"name": g, "nodes": nodes, "prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0,
                        "max_concurrency": 24} for g in names],
            "workload": [{"group": g, "rate_rps": rate_per_node * nodes, "trace": "azure_llm_2023_conv"}
                         for g in names],
            "faults": [{"group": names[k], "node": 3, "kind": "thermal_throttle", "start_s": at, "slowdown": slow}
                       for k, at in enumerate(onsets_s)],
        }
        scn = parse_scenario(doc, source="bench.fastpath")
        self.sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin")).begin()
        self.t0 = time.time()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Simulated time 0 is now."""
        self.t0 = time.time()

    def page(self, path: str) -> bytes:
        """``/g<k>/n<i>/metrics``: that engine's page at the current wall-clock instant."""
        parts = path.strip("/").split("/")
        k, i = int(parts[0][1:]), int(parts[1][1:])
        with self._lock:
            now = time.time() - self.t0
            self.sim.advance(now)
            eng = self.sim.eng[self.sim.offset[k] + i]
            eng.progress_to(now)
            return eng.m.render().encode()

    def serve(self) -> tuple[Any, int]:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        pages = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = pages.page(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True, name="engine-pages").start()
        return server, server.server_address[1]


def bench_drill(onsets: int = 10, nodes: int = 8, warmup_s: float = 25.0, gap_s: float = 6.0,
                slow: float = 3.0) -> dict[str, Any]:
    """End to end at the production defaults (scrapes every ``METRICS_SCRAPE_INTERVAL_MS``, ticks on
    new rows and every ``TICK_INTERVAL_MS``): ``onsets`` groups of ``nodes`` simulated model servers,
    scraped over HTTP by ``manage.py scrape_metrics`` and ticked by ``manage.py run_ticker`` (two
    processes); after ``warmup_s`` one node of each group in turn is throttled to ``1 / slow`` of its
    output tokens/s (:class:`_EnginePages`: the pages are the step engine's, full vLLM V1 pages).
    ``cut_s`` and ``quarantine_s``: fault onset -> its weight below base / its state ``quarantined``
    in the weights document (polled every 20 ms). A false cut: any other node below its base
    weight at any poll (healthy nodes of every group, faulted ones excluded once their fault began)."""
    import subprocess
    import sys
    from pathlib import Path

    from django.conf import settings
    from django.db import connection

    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.control.publish import read_weights

    pages = _EnginePages(onsets, nodes, [warmup_s + k * gap_s for k in range(onsets)], slow)
    server, port = pages.serve()
    stamp = int(time.time())
    groups = []
    for k in range(onsets):
        g = do_create_group(f"fp-drill-{stamp}-{k}", actor="bench", reason="seed drill")
        for i in range(nodes):
            do_register_node(g, f"127.0.0.{k + 2}:{9000 + i}", actor="bench",
                             metrics_url=f"http://127.0.0.1:{port}/g{k}/n{i}/metrics")
        groups.append(g.name)
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "REDIS_URL": settings.REDIS_URL, "LOG_LEVEL": "WARNING", "WORKER_METRICS_PORT": "0"}
    for name in ("TICK_INTERVAL_MS", "METRICS_SCRAPE_INTERVAL_MS", "TICK_LOCK_TTL_MS"):
        env.pop(name, None)  # production defaults
    root = Path(__file__).resolve().parent.parent
    procs = [subprocess.Popen([sys.executable, "manage.py", *cmd], cwd=root, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for cmd in (["scrape_metrics"], *(["run_ticker", "--id", f"drill-{stamp}-{x}", "--match",
                                                f"fp-drill-{stamp}-*"] for x in "ab"))]
    pages.start()
    cut, quarantine, false_cuts, faulted = [], [], set(), set()
    try:
        for k, name in enumerate(groups):
            faulty = f"127.0.0.{k + 2}:9003"
            onset = pages.t0 + warmup_s + k * gap_s  # the engine throttles the node at this instant
            time.sleep(max(0.0, onset - time.time()))
            faulted.add(faulty)
            t_cut = t_q = None
            while time.time() - onset < gap_s and t_q is None:
                for other in groups:
                    doc = read_weights(other) or {"nodes": []}
                    for n in doc["nodes"]:
                        if n["weight"] < n["base_weight"] and n["node"] not in faulted:
                            false_cuts.add(n["node"])
                        if other == name and n["node"] == faulty:
                            if t_cut is None and n["weight"] < n["base_weight"]:
                                t_cut = time.time() - onset
                            if t_q is None and n["state"] == "quarantined":
                                t_q = time.time() - onset
                time.sleep(0.02)
            cut.append(t_cut)
            quarantine.append(t_q)
            print(f"drill onset {k + 1}: cut {t_cut} s, quarantine {t_q} s", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
        server.shutdown()

    def stat(xs: list[float | None]) -> dict[str, Any]:
        got = [x for x in xs if x is not None]
        return {"median": round(float(np.median(got)), 2) if got else None,
                "p95": round(float(np.percentile(got, 95)), 2) if got else None, "missed": len(xs) - len(got)}

    return {"cut_s": stat(cut), "quarantine_s": stat(quarantine), "false_cuts": sorted(false_cuts),
            "onsets": onsets, "nodes_per_group": nodes, "slowdown": slow, "pages": "sim step engine (vLLM V1)",
            "scrape_interval_ms": settings.METRICS_SCRAPE_INTERVAL_MS, "tick_interval_ms": settings.TICK_INTERVAL_MS}


def on_paper(tick_cpu_ms_100: float, groups: int = 1000, hz: float = 1.0, utilisation: float = 0.7) -> dict[str, Any]:
    """Worker processes for ``groups`` x 100 nodes at ``hz``: ``groups * hz * tick_ms / 1000`` core-
    seconds per second, each process used at most ``utilisation`` (headroom for bursts and GC)."""
    busy = groups * hz * tick_cpu_ms_100 / 1000.0
    return {"groups": groups, "nodes_per_group": 100, "tick_hz": hz, "tick_ms_per_group": tick_cpu_ms_100,
            "cores_busy": round(busy, 1), "worker_processes": int(np.ceil(busy / utilisation))}


# The asynchronous model-server scraper's benchmark (``bench.scraper``): a callable
# returning ``{"scrape_nodes_per_process_4hz": n, ...}``. Looked up at run time (skipped if absent).
SCRAPE_BENCH_HOOK = "bench.scraper:run"


def bench_scrape() -> dict[str, Any] | None:
    import importlib

    module, _, name = SCRAPE_BENCH_HOOK.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        print(f"scrape: {SCRAPE_BENCH_HOOK} not available: skipped", flush=True)
        return None
    figures = fn()
    return {"scrape_nodes_per_process_4hz": figures.get("scrape_nodes_per_process_4hz"), "scrape": figures}


SECTIONS = ("tick", "scale", "ingest", "drill", "scrape")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/bench-fastpath.json")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--scale-seconds", type=float, default=12.0)
    ap.add_argument("--sizes", default="10,100,1000", help="group sizes of the tick section")
    ap.add_argument("--scale-groups", default="2,4,8,16,32,64,128",
                    help="group counts of the scale section, ascending (it stops at the first not held)")
    ap.add_argument("--merge", action="store_true", help="update the --out file instead of replacing it")
    args = ap.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    _setup()
    figures: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 1)}
    figures["evaluate_cpu_ms_100_nodes"] = bench_evaluate()
    print(f"detector evaluate, 100 nodes: {figures['evaluate_cpu_ms_100_nodes']} ms CPU "
          "(0.6 ms on an idle core)", flush=True)
    if "tick" in only:
        sizes = tuple(min(max(int(x), 2), 5000) for x in args.sizes.split(",") if x.strip())
        cost = bench_tick(sizes=sizes, ticks=args.ticks)
        figures["tick_ms_by_nodes"] = cost
        if "100" in cost:
            figures["tick_ms_100_nodes"] = {"p50": cost["100"]["p50"], "p95": cost["100"]["p95"]}
            figures["paper_1000_groups_x_100_nodes"] = on_paper(cost["100"]["cpu_p50"])
    if "scale" in only:
        counts = tuple(sorted({min(max(int(x), 1), 1000) for x in args.scale_groups.split(",") if x.strip()}))
        figures["scale"] = bench_scale(group_counts=counts, seconds=args.scale_seconds)
    if "ingest" in only:
        figures["ingest"] = bench_ingest()
    if "drill" in only:
        drill = bench_drill()
        figures["drill"] = drill
        figures["cut_s"], figures["quarantine_s"] = drill["cut_s"], drill["quarantine_s"]
    if "scrape" in only:
        scrape = bench_scrape()
        if scrape:
            figures.update(scrape)
    out = Path(args.out)
    if args.merge and out.exists():  # a section re-run keeps the other sections' figures
        figures = {**json.loads(out.read_text()), **figures}
    print(json.dumps(figures, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
