"""Pipeline benchmark: HTTP -> stream -> tick throughput, tick latency, decision-to-publish latency.

Run against real services (it creates a token and groups named ``bench-*`` in that database and
FLUSHes nothing; use a dedicated Redis db number)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_pipeline REDIS_URL=redis://127.0.0.1:6379/1 \\
        .venv/bin/python -m bench.pipeline --out reports/bench-pipeline.json

It starts gunicorn (2 sync workers) on a free loopback port, posts batches of records with httpx
while this process runs the ticks, and prints/writes the figures. Not a test: no assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=5000)
    ap.add_argument("--single", type=int, default=500, help="requests of one record each (baseline)")
    ap.add_argument("--out", default="reports/bench-pipeline.json")
    args = ap.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    import django

    django.setup()
    import httpx
    import orjson

    from harness.records import make_records
    from outlier_admin.control.actions import do_create_group, do_create_token
    from outlier_admin.control.tick import run_tick

    _, token = do_create_token(name=f"bench-{int(time.time())}", scope="ingest", actor="bench")
    port = _free_port()
    root = Path(__file__).resolve().parent.parent
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "outlier_admin.wsgi", "-w", "2", "-b", f"127.0.0.1:{port}",
         "--log-level", "warning"], cwd=root,
    )
    url = f"http://127.0.0.1:{port}/api/v1/ingest/requests"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        client = httpx.Client(timeout=60)
        for _ in range(100):
            try:
                client.get(url)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        rng = np.random.default_rng(0)
        group = f"bench-{int(time.time())}"
        do_create_group(group, actor="bench", reason="pipeline benchmark")
        per_node = args.batch_size // 8
        bodies = [orjson.dumps(make_records(time.time(), group=group, per_node=per_node, rng=rng))
                  for _ in range(args.batches)]
        # warm-up: create the group and nodes, first tick
        client.post(url, content=bodies[0], headers=headers)
        run_tick(group)

        # Gateways post while the control loop ticks (as gunicorn + a Celery worker would): two
        # posting threads, ticks in this thread until every accepted record went through a tick.
        import threading
        from concurrent.futures import ThreadPoolExecutor

        tick_ms, publish_ms, accepted, ticked = [], [], [0], 0
        lock = threading.Lock()

        def post(body: bytes) -> None:
            with httpx.Client(timeout=60) as c:
                n = c.post(url, content=body, headers=headers).json()["accepted"]
            with lock:
                accepted[0] += n

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(post, body) for body in bodies[1:]]
            while not all(f.done() for f in futures):
                res = run_tick(group)
                ticked += res.samples
                if res.samples:
                    tick_ms.append(res.tick_ms)
                    publish_ms.append(res.publish_latency_ms)
                else:
                    time.sleep(0.05)
        while (res := run_tick(group)).samples:
            ticked += res.samples
            tick_ms.append(res.tick_ms)
            publish_ms.append(res.publish_latency_ms)
        total_records = accepted[0]
        elapsed = time.perf_counter() - started
        batched_rate = total_records / elapsed

        singles = make_records(time.time(), group=group, per_node=max(args.single // 8, 1), rng=rng)
        started = time.perf_counter()
        for rec in singles:
            client.post(url, content=orjson.dumps([rec]), headers=headers)
        run_tick(group)
        single_rate = len(singles) / (time.perf_counter() - started)

        empty_ticks = [run_tick(group).publish_latency_ms for _ in range(200)]
        figures = {
            "records_per_s_batched_http_stream_tick": round(batched_rate),
            "records_per_s_one_record_per_request": round(single_rate, 1),
            "batched_over_single_ratio": round(batched_rate / single_rate, 1),
            "batch_size": args.batch_size,
            "records_through_ticks": ticked,
            "tick_ms_p50": round(float(np.percentile(tick_ms, 50)), 2),
            "tick_ms_p99": round(float(np.percentile(tick_ms, 99)), 2),
            "publish_latency_ms_p50": round(float(np.percentile(publish_ms + empty_ticks, 50)), 3),
            "publish_latency_ms_p99": round(float(np.percentile(publish_ms + empty_ticks, 99)), 3),
            "nodes": 8,
            "cpu_count": os.cpu_count(),
        }
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(json.dumps(figures, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
