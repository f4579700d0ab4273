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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _wait_up(client: Any, url: str) -> None:
    """Up to 10 s for gunicorn to answer at all (a GET of the ingest URL is refused, but answered)."""
    import httpx

    for _ in range(100):
        try:
            client.get(url)
            break
        except httpx.HTTPError:
            time.sleep(0.1)


def _batched(url: str, headers: dict[str, str], group: str, bodies: list[bytes]
             ) -> tuple[int, float, int, list[float], list[float]]:
    """Gateways post while the control loop ticks (as gunicorn + a Celery worker would): two posting
    threads, ticks in this thread until every accepted record went through a tick. Returns the
    records accepted, the seconds it took, the records through the ticks, and each working tick's
    duration and decision-to-publish latency (ms)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from outlier_admin.control.tick import run_tick

    tick_ms, publish_ms, accepted, ticked = [], [], [0], 0
    lock = threading.Lock()

    def post(body: bytes) -> None:
        with httpx.Client(timeout=60) as c:
            n = c.post(url, content=body, headers=headers).json()["accepted"]
        with lock:
            accepted[0] += n

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(post, body) for body in bodies]
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
    return accepted[0], time.perf_counter() - started, ticked, tick_ms, publish_ms


def _single_rate(client: Any, url: str, headers: dict[str, str], group: str, records: list[dict]) -> float:
    """Records per second posted one per request, then one tick (the baseline of the batched rate)."""
    import orjson

    from outlier_admin.control.tick import run_tick

    started = time.perf_counter()
    for rec in records:
        client.post(url, content=orjson.dumps([rec]), headers=headers)
    run_tick(group)
    return len(records) / (time.perf_counter() - started)


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

    from harness.gateways import free_port
    from harness.records import make_records
    from outlier_admin.control.actions import do_create_group, do_create_token
    from outlier_admin.control.tick import run_tick

    _, token = do_create_token(name=f"bench-{int(time.time())}", scope="ingest", actor="bench")
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "outlier_admin.wsgi", "-w", "2", "-b", f"127.0.0.1:{port}",
         "--log-level", "warning"], cwd=root,
    )
    url = f"http://127.0.0.1:{port}/api/v1/ingest/requests"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        client = httpx.Client(timeout=60)
        _wait_up(client, url)
        rng = np.random.default_rng(0)
        group = f"bench-{int(time.time())}"
        do_create_group(group, actor="bench", reason="pipeline benchmark")
        per_node = args.batch_size // 8
        bodies = [orjson.dumps(make_records(time.time(), group=group, per_node=per_node, rng=rng))
                  for _ in range(args.batches)]
        # warm-up: create the group and nodes, first tick
        client.post(url, content=bodies[0], headers=headers)
        run_tick(group)

        total_records, elapsed, ticked, tick_ms, publish_ms = _batched(url, headers, group, bodies[1:])
        batched_rate = total_records / elapsed
        singles = make_records(time.time(), group=group, per_node=max(args.single // 8, 1), rng=rng)
        single_rate = _single_rate(client, url, headers, group, singles)
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
