"""What the replica acknowledgement costs the ingest (``REDIS_MIN_REPLICAS_ACK``): records/s and the
request latency through the real ingest path, with 0 (no wait) and 1 (``WAIT 1`` before the 200).

Run against the machine's PostgreSQL (it creates a token and a group ``bench-ack-*``); Redis is its
own: one primary, one replica and three Sentinels on free loopback ports (16300+, 26300+), stopped at
the end, reached as ``redis+sentinel://``::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_sentinel \\
        .venv/bin/python -m bench.replica_ack --out reports/bench-replica-ack.json

For each setting it starts gunicorn (2 sync workers) on a free loopback port and posts bodies of
``--batch-sizes`` records (each with a ``request_id``) from ``--posters`` threads. Not a test: no
assertions; it prints the figures and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _run(url: str, ack: int, token: str, group: str, sizes: list[int], requests: int, posters: int) -> list[dict]:
    import httpx
    import orjson

    from harness.gateways import free_port
    from harness.records import make_records

    port = free_port()
    env = {**os.environ, "REDIS_URL": url, "REDIS_MIN_REPLICAS_ACK": str(ack), "OUTLIER_TESTING": "1",
           "LOG_LEVEL": "WARNING"}
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "outlier_admin.wsgi", "-w", "2", "-b",
                               f"127.0.0.1:{port}", "--log-level", "warning"], cwd=ROOT, env=env)
    endpoint = f"http://127.0.0.1:{port}/api/v1/ingest/requests"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    rows = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("gunicorn did not start") from None
                time.sleep(0.2)
        rng = np.random.default_rng(7)
        for size in sizes:
            bodies = []
            for b in range(requests + posters):  # the first ``posters`` warm up
                recs = make_records(time.time(), group=group, nodes=4, per_node=max(size // 4, 1), rng=rng)[:size]
                for k, rec in enumerate(recs):
                    rec["request_id"] = f"ack{ack}-s{size}-{b}-{k}-{time.time_ns()}"
                bodies.append(orjson.dumps(recs))

            def post(body: bytes, client: httpx.Client) -> tuple[int, float]:
                t0 = time.perf_counter()
                resp = client.post(endpoint, content=body, headers=headers)
                return resp.status_code, time.perf_counter() - t0

            with httpx.Client(timeout=30) as client, ThreadPoolExecutor(posters) as pool:
                list(pool.map(lambda body: post(body, client), bodies[:posters]))
                t0 = time.perf_counter()
                out = list(pool.map(lambda body: post(body, client), bodies[posters:]))
                took = time.perf_counter() - t0
            ok = [lat for status, lat in out if status == 200]
            row = {"replica_ack": ack, "batch_size": size, "requests": requests, "posters": posters,
                   "ok": len(ok), "records_per_s": round(len(ok) * size / took),
                   "p50_ms": round(float(np.percentile(ok, 50)) * 1000, 2) if ok else None,
                   "p99_ms": round(float(np.percentile(ok, 99)) * 1000, 2) if ok else None}
            print(json.dumps(row))
            rows.append(row)
    finally:
        server.terminate()
        server.wait(timeout=15)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", default="10,100,1000")
    ap.add_argument("--requests", type=int, default=300, help="per batch size and setting")
    ap.add_argument("--posters", type=int, default=4)
    ap.add_argument("--out", default="reports/bench-replica-ack.json")
    args = ap.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    os.environ.setdefault("OUTLIER_TESTING", "1")
    import django

    django.setup()
    from harness.sentinel_cluster import SentinelCluster
    from outlier_admin.control.actions import do_create_group, do_create_token, do_register_node

    stamp = int(time.time())
    _, token = do_create_token(name=f"bench-ack-{stamp}", scope="ingest", actor="bench")
    group = do_create_group(f"bench-ack-{stamp}", actor="bench")
    for i in range(4):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="bench")
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        cluster = SentinelCluster(Path(tmp))
        try:
            cluster.start()
            rows = [row for ack in (0, 1)
                    for row in _run(cluster.url(), ack, token, group.name, sizes, args.requests, args.posters)]
        finally:
            cluster.stop()
    summary = []
    for size in sizes:
        base = next(r for r in rows if r["batch_size"] == size and r["replica_ack"] == 0)
        acked = next(r for r in rows if r["batch_size"] == size and r["replica_ack"] == 1)
        cost = 1 - acked["records_per_s"] / base["records_per_s"] if base["records_per_s"] else None
        summary.append({"batch_size": size, "records_per_s_no_ack": base["records_per_s"],
                        "records_per_s_ack": acked["records_per_s"],
                        "throughput_cost": None if cost is None else round(cost, 3),
                        "p50_ms_added": round(acked["p50_ms"] - base["p50_ms"], 2)})
        print(f"batch {size:>5}: {base['records_per_s']:>8} records/s without, {acked['records_per_s']:>8} with "
              f"the replica ack ({summary[-1]['throughput_cost']:+.1%} ); p50 {base['p50_ms']} -> {acked['p50_ms']} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": rows, "summary": summary, "cores": os.cpu_count()}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
