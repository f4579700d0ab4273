"""Server time of the dashboard's two heavy pages on real PostgreSQL data (issue 5's closing figures).

- group page with 1,000 nodes (nodes table with each node's latest EMA/Z/P50/P99/samples), target <= 300 ms;
  (the table is sorted over all 1,000 nodes and shows one page of ``GROUP_PAGE_SIZE`` rows; also
  measured sorted by Z, and the table-only refresh);
- a 24-hour node timeline (8,640 history rows per signal, downsampled to <= 2,000 points), target
  <= 200 ms, measured on the API (``GET /api/v1/nodes/<id>/timeline/?hours=24``) and on the node page
  (timeline + the group's stored detector baseline + four SVG charts).

Data: a dedicated database (default ``oa_dash_bench``; ``--database-url``) is migrated and filled once
with COPY: 1,000 nodes, 30 min of history for every node, 24 h of history (3 signals) for the node
under test and its 16 baseline peers, 24 h of the group's baseline (3 signals, one row per 10 s). Times are server-side (Django test client in-process: URL
resolution, auth, queries, template rendering; no network), median and p95 of ``--runs`` requests
after one warm-up. Prints a table and writes JSON (default ``reports/bench-dashboard.json``).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/oa_dash_bench .venv/bin/python bench/dashboard.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES = 1000
EVERY_S = 10
GROUP = "bench-1000"


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    # The Django test client runs in-process: test settings (no SECRET_KEY / HTTPS redirect needed).
    os.environ.setdefault("OUTLIER_TESTING", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    import psycopg

    base, _, name = database_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(now: datetime) -> tuple[int, int]:
    """Create the bench group once; returns ``(group_id, node_id of the node under test)``."""
    import numpy as np
    from django.db import connection

    from outlier_admin.control.actions import do_create_group
    from outlier_admin.control.models import NodeHistory
    from outlier_admin.fleet.models import ModelGroup, Node

    group = ModelGroup.objects.filter(name=GROUP).first()
    if group is not None:
        seed_baseline(group.pk, now)
        return group.pk, Node.objects.filter(group=group).order_by("pk").values_list("pk", flat=True).first()
    print("seeding (once) ...", flush=True)
    group = do_create_group(GROUP, actor="bench", policy="auto")
    Node.objects.bulk_create([
        Node(group=group, name=f"10.{i // 250}.{i % 250}.1:8000", address=f"10.{i // 250}.{i % 250}.1:8000",
             state="quarantined" if i % 97 == 0 else "degraded" if i % 31 == 0 else "healthy",
             weight=0 if i % 97 == 0 else 100, last_seen=now)
        for i in range(NODES)
    ], batch_size=1000)
    ids = list(Node.objects.filter(group=group).order_by("pk").values_list("pk", flat=True))
    rng = np.random.default_rng(5)
    table = NodeHistory._meta.db_table
    cols = "(node_id, signal, at, ema, z, p50, p99, samples, weight, state, downsampled)"
    with connection.cursor() as cur, cur.cursor.copy(f"COPY {table} {cols} FROM STDIN") as copy:
        short = 30 * 60 // EVERY_S
        long = 24 * 3600 // EVERY_S
        for k, nid in enumerate(ids):
            n_rows, signals = (long, ("norm", "prefill", "decode")) if k <= 16 else (short, ("norm",))
            start = now - timedelta(seconds=n_rows * EVERY_S)
            slow = 1.8 if k == 0 else 1.0
            for sig in signals:
                ema = rng.normal(1.0, 0.03, n_rows) * slow
                z = (ema - 1.0) / 0.05
                for i in range(n_rows):
                    copy.write_row((nid, sig, start + timedelta(seconds=i * EVERY_S), float(ema[i]), float(z[i]),
                                    float(ema[i]), float(ema[i] * 2.2), 100 + i, 100.0, "healthy", False))
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {table}")
    seed_baseline(group.pk, now)
    return group.pk, ids[0]


def seed_baseline(group_id: int, now: datetime) -> None:
    """24 h of the group's stored baseline (one row per signal every ``EVERY_S``), once (databases
    seeded before the GroupBaseline table get it on the next run)."""
    import numpy as np
    from django.db import connection

    from outlier_admin.control.models import GroupBaseline

    if GroupBaseline.objects.filter(group_id=group_id).exists():
        return
    print("seeding the group baseline (once) ...", flush=True)
    rng = np.random.default_rng(6)
    table = GroupBaseline._meta.db_table
    n_rows = 24 * 3600 // EVERY_S
    start = now - timedelta(seconds=n_rows * EVERY_S)
    with connection.cursor() as cur, cur.cursor.copy(
            f"COPY {table} (group_id, signal, at, baseline, spread, peers, downsampled) FROM STDIN") as copy:
        for sig in ("norm", "prefill", "decode"):
            base = rng.normal(1.0, 0.005, n_rows)
            for i in range(n_rows):
                copy.write_row((group_id, sig, start + timedelta(seconds=i * EVERY_S), float(base[i]), 0.05,
                                NODES - 40, False))
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {table}")


def timed(client, url: str, runs: int) -> dict[str, float]:
    client.get(url)  # warm-up (template compilation, query plans)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        resp = client.get(url)
        times.append((time.perf_counter() - t0) * 1000.0)
        if resp.status_code != 200:
            raise SystemExit(f"{url}: HTTP {resp.status_code}")
    times.sort()
    return {"median_ms": round(statistics.median(times), 1), "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
            "min_ms": round(times[0], 1), "runs": runs, "bytes": len(resp.content)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/oa_dash_bench"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench-dashboard.json"))
    args = ap.parse_args()
    setup_django(args.database_url)

    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    now = datetime.now(UTC)
    _, node_id = seed(now)
    user, _ = User.objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    results = {
        "group_page_1000_nodes": {**timed(client, f"/groups/{GROUP}/", args.runs), "target_ms": 300},
        "group_page_1000_nodes_sorted_by_z": {**timed(client, f"/groups/{GROUP}/?sort=-z", args.runs),
                                              "target_ms": 300},
        "group_table_refresh_1000_nodes": {**timed(client, f"/groups/{GROUP}/?partial=nodes", args.runs),
                                           "target_ms": 300},
        "timeline_api_24h": {**timed(client, f"/api/v1/nodes/{node_id}/timeline/?hours=24", args.runs),
                             "target_ms": 200},
        "node_page_24h": {**timed(client, f"/nodes/{node_id}/?hours=24", args.runs), "target_ms": 200},
    }
    points = len(client.get(f"/api/v1/nodes/{node_id}/timeline/?hours=24").json()["points"])
    report = {"generated_at": now.isoformat(), "nodes": NODES, "history_every_s": EVERY_S,
              "timeline_points_24h": points, "results": results}
    print(f"{'page':34} {'median ms':>10} {'p95 ms':>8} {'target':>7}  ok")
    for name, r in results.items():
        ok = "yes" if r["median_ms"] <= r["target_ms"] else "NO"
        print(f"{name:34} {r['median_ms']:>10} {r['p95_ms']:>8} {r['target_ms']:>7}  {ok}")
    print(f"24 h timeline: {points} points")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
