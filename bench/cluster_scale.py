"""How many groups x 100 nodes the control plane's Redis holds at 1 Hz: one Redis vs a Redis Cluster of
three primaries on this machine, with the checkpoint as it was (version 1 snapshot) and packed (version 2).

What one group-second costs Redis is replayed with the control plane's own code and payloads, without
PostgreSQL or the detector's arithmetic (what runs on the worker's CPU, not Redis's): the ingest append
of the second's records (one MULTI: ``XADD`` of 200 records' rows and the ``request_id`` set), then one
tick as :mod:`outlier_admin.control.tick` does it: the lock (:func:`~outlier_admin.control.redis_conn.tick_lock`
semantics, ``GroupLock``), the fence (``Fence``: ``WATCH`` state and lock), the read pipeline (lock,
state fields, marks, outbox, ``XAUTOCLAIM`` and two ``XREADGROUP``), the fenced MULTI/EXEC with the
weights document (:func:`outlier_admin.control.publish.queue_document`, a real 100-node document) and
the state fields, plus the detector checkpoint every 5th tick (``TICK_LOCK_TTL_MS`` 5 s at 1 Hz: a real
100-node ``GroupDetector.to_bytes()`` with full tail windows), then ``XACK`` / ``XTRIM`` and the lock's
release. Keys are :mod:`contract.keys`'s, so a group is one slot on the cluster.

Every Redis is its own (``redis-server`` on free loopback ports, stopped at the end). ``--procs`` client
processes share the groups; each ticks its groups once a second. A count is *held* when the ticks start
within 1 s of when they are due (p99) and no group is left behind; counts double from ``--start`` until
one is not held. Per step it reads each server's CPU (``INFO cpu``), bytes in (``INFO stats``) and
commands, and the clients' own CPU, to say where the limit is. Not a test: it prints the figures and
writes them as JSON::

    .venv/bin/python -m bench.cluster_scale --out reports/bench-cluster-scale.json
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
os.environ.setdefault("OUTLIER_TESTING", "1")  # no database is used: the settings of a test run

from contract import keys  # noqa: E402  (after the path: runs as a script too)

NODES = 100
RECORDS_PER_S = 200  # 2 requests/s per node
CHECKPOINT_EVERY = 5  # ticks: TICK_LOCK_TTL_MS (5 s) at 1 Hz
STEP_S = 8.0
HELD_LATE_P99_MS = 1000.0  # a tick starts at most a second after it was due (p99), none left behind


# --------------------------------------------------------------------------------------------- payloads


def payloads() -> dict[str, Any]:
    """A real 100-node weights document, an ingest entry's rows and the checkpoint in both formats."""
    import orjson

    from detector import snapshot as snap
    from detector.group import GroupDetector
    from detector.thresholds import Thresholds
    from harness.fleet import Fleet, run

    fleet = Fleet(NODES, seed=5, rate=40_000)  # 400 requests/s per node: full tail windows in 3 s
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 3.0, tick=0.5)
    v2 = gd.to_bytes()
    with np.load(io.BytesIO(v2), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    arrays = snap.unpack(arrays, meta.pop("packed"))
    meta["version"] = 1
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    pack_ms = _best_ms(gd.to_bytes)
    load_ms = _best_ms(lambda: GroupDetector.from_bytes(v2))
    doc = {"group": "g", "version": 1, "generated_at": time.time(), "stale_after_s": 30, "safeguard": False,
           "nodes": [{"node": f"127.0.{i // 250}.{i % 250 + 1}:8000", "address": f"127.0.{i // 250}.{i % 250 + 1}:8000",
                      "weight": 100, "state": "healthy", "base_weight": 100} for i in range(NODES)]}
    rng = np.random.default_rng(1)
    rows = [[f"127.0.0.{i % NODES + 1}:8000", round(time.time() - rng.random(), 3), int(rng.integers(50, 2000)),
             int(rng.integers(20, 400)), round(float(rng.lognormal(7, 0.3)), 3), round(float(rng.lognormal(5, 0.3)), 3),
             200, None, None] for i in range(RECORDS_PER_S)]
    return {"doc": orjson.dumps(doc), "doc_dict": doc, "rows": orjson.dumps(rows), "checkpoint": {"v1": buf.getvalue(), "v2": v2},
            "pack_ms": round(pack_ms, 2), "load_ms": round(load_ms, 2)}


def _best_ms(f: Any, n: int = 9) -> float:
    """The least CPU time of ``n`` calls, in ms (CPU, not wall: on a shared machine the wall time is mostly waiting)."""
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        f()
        best = min(best, time.process_time() - t0)
    return best * 1000


# --------------------------------------------------------------------------------------------- servers


class SingleRedis:
    def __init__(self, workdir: Path) -> None:
        from harness.redis_cluster import REDIS_SERVER, free_port

        self.port = free_port(17200, set())
        self.proc = subprocess.Popen([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ports = [self.port]

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)


def server_stats(ports: list[int]) -> dict[int, dict[str, float]]:
    import redis

    out = {}
    for port in ports:
        r = redis.Redis(port=port)
        cpu, stats = r.info("cpu"), r.info("stats")
        out[port] = {"cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                     "bytes_in": float(stats["total_net_input_bytes"]),
                     "commands": float(stats["total_commands_processed"]),
                     "used_memory": float(r.info("memory")["used_memory"])}
        r.close()
    return out


def _flush(ports: list[int]) -> None:
    import redis

    for port in ports:
        redis.Redis(port=port).flushall()


# --------------------------------------------------------------------------------------------- clients


def group_second(r: Any, group: str, n: int, p: dict[str, Any], checkpoint: bytes) -> float:
    """One group's second on Redis (module docstring); returns the tick's Redis time in ms."""
    import redis

    from outlier_admin.control import publish
    from outlier_admin.control.redis_conn import Fence, GroupLock, LeaseLost

    ids = [secrets.token_hex(6) for _ in range(4)]
    pipe = r.pipeline(transaction=True)
    pipe.xadd(keys.stream(group), {"rows": p["rows"]}, maxlen=100_000, approximate=True)
    pipe.sadd(keys.dedup(group, int(time.time() // 60)), *ids)
    pipe.execute()

    t0 = time.perf_counter()
    lock = GroupLock(r, keys.tick_lock(group), 5000)
    if not lock.acquire():
        return (time.perf_counter() - t0) * 1000
    skey, hkey = keys.stream(group), keys.state(group)
    fence = Fence(r, lock, hkey)
    try:
        read = r.pipeline(transaction=False)
        read.get(lock.key)
        read.hmget(hkey, ["rev", "last_id", "version", "checkpoint_at"])
        read.get(keys.inputs(group))
        read.exists(keys.outage_version(group), keys.outbox(group))
        read.xautoclaim(skey, "ticks", "bench", min_idle_time=10_000, start_id="0-0", count=1000)
        read.xreadgroup("ticks", "bench", {skey: "0"}, count=1000)
        read.xreadgroup("ticks", "bench", {skey: ">"}, count=1000)
        lock_value, state, *_rest, got = read.execute(raise_on_error=False)
        if isinstance(got, redis.ResponseError):  # first tick: the consumer group
            r.xgroup_create(skey, "ticks", id="0", mkstream=True)
            got = []
        entries = [eid for _, items in (got or []) for eid, _ in items]
        doc = publish.build_document(group, n, p["doc_dict"]["nodes"], safeguard=False, now=time.time(),
                                     stale_after_s=30)

        def queue(q: Any) -> None:
            publish.queue_document(q, doc)
            mapping = {"rev": secrets.token_hex(8), "version": n, "history_slot": n // 60}
            if n % CHECKPOINT_EVERY == 0:
                mapping.update(detector=checkpoint, last_id=entries[-1] if entries else b"0-0", checkpoint_at=time.time())
            q.hset(hkey, mapping=mapping)

        fence.commit(lock_value, state[0] if isinstance(state, list) else None, queue)
    except LeaseLost:
        pass
    finally:
        fence.close()
    after = r.pipeline(transaction=False)
    if entries:
        after.xack(skey, "ticks", *entries)
        if n % CHECKPOINT_EVERY == 0:
            after.xtrim(skey, minid=entries[-1], approximate=False)
        after.execute()
    lock.release()
    return (time.perf_counter() - t0) * 1000


def client_proc(url: str, groups: list[str], seconds: float, p: dict[str, Any], fmt: str, out: Any) -> None:
    from outlier_admin.control.redis_conn import client_for

    r = client_for(url)
    checkpoint = p["checkpoint"][fmt]
    ticks = {g: 0 for g in groups}
    lat: list[float] = []
    late: list[float] = []  # ms each tick started after it was due
    errors = 0
    cpu0, start = time.process_time(), time.monotonic()
    due = {g: start + i / max(len(groups), 1) for i, g in enumerate(groups)}  # spread over the second
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        g = min(due, key=due.get)
        wait = due[g] - now
        if wait > 0:
            time.sleep(min(wait, start + seconds - now))
            continue
        late.append((now - due[g]) * 1000)
        try:
            lat.append(group_second(r, g, ticks[g] + 1, p, checkpoint))
            ticks[g] += 1
        except Exception:  # a refused or timed-out tick: counted, the group is late
            errors += 1
        due[g] += 1.0
    end = start + seconds
    behind = sum(1 for t in due.values() if t < end - 1.0)  # a tick due over a second ago never ran
    out.put({"ticks": ticks, "lat": lat, "late": late, "behind": behind, "errors": errors,
             "cpu_s": time.process_time() - cpu0})


def step(server: Any, groups: int, procs: int, p: dict[str, Any], fmt: str, seconds: float) -> dict[str, Any]:
    names = [f"bench-{fmt}-{groups}-{i}" for i in range(groups)]
    before = server_stats(server.ports)
    q: Any = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(
        target=client_proc, args=(server.url(), names[i::procs], seconds, p, fmt, q)) for i in range(procs)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    results = [q.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    wall = time.monotonic() - t0
    after = server_stats(server.ports)
    _flush(server.ports)  # each step starts empty: memory is per step, not the sum of the steps
    ticks = {g: n for res in results for g, n in res["ticks"].items()}
    lat = [x for res in results for x in res["lat"]]
    late = [x for res in results for x in res["late"]]
    behind = sum(res["behind"] for res in results)
    rates = [n / seconds for n in ticks.values()]
    late_p99 = float(np.percentile(late, 99)) if late else 1e9
    server_cpu = {port: (after[port]["cpu_s"] - before[port]["cpu_s"]) / wall for port in server.ports}
    bytes_in = sum(after[p_]["bytes_in"] - before[p_]["bytes_in"] for p_ in server.ports) / wall
    commands = sum(after[p_]["commands"] - before[p_]["commands"] for p_ in server.ports)
    total_ticks = sum(ticks.values())
    out = {
        "groups": groups, "held": bool(behind == 0 and late_p99 < HELD_LATE_P99_MS),
        "late_ms_p50": round(float(np.percentile(late, 50)), 1) if late else None,
        "late_ms_p99": round(late_p99, 1), "groups_behind": behind,
        "ticks_per_s_mean": round(float(np.mean(rates)), 3),
        "tick_redis_ms_p50": round(float(np.percentile(lat, 50)), 1) if lat else None,
        "tick_redis_ms_p99": round(float(np.percentile(lat, 99)), 1) if lat else None,
        "errors": sum(res["errors"] for res in results),
        "server_cpu_cores": {str(k): round(v, 2) for k, v in server_cpu.items()},
        "server_cpu_max_core": round(max(server_cpu.values()), 2),
        "client_cpu_cores": round(sum(res["cpu_s"] for res in results) / wall, 2),
        "bytes_in_mb_s": round(bytes_in / 1e6, 1),
        # Redis's own cost per group-second: how many groups one Redis core (or one primary) takes.
        "redis_cpu_ms_per_group_s": round(sum(server_cpu.values()) / groups * 1000, 3),
        "kb_in_per_group_s": round(bytes_in / groups / 1e3, 1),
        "client_cpu_ms_per_group_s": round(sum(res["cpu_s"] for res in results) / wall / groups * 1000, 3),
        "commands_per_group_tick": round(commands / max(total_ticks, 1), 1),
        "used_memory_mb": round(sum(after[p_]["used_memory"] for p_ in server.ports) / 1e6, 1),
    }
    return out


def run_topology(name: str, server: Any, p: dict[str, Any], fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    steps, groups = [], args.start
    while groups <= args.max_groups:
        s = step(server, groups, args.procs, p, fmt, args.step_s)
        steps.append(s)
        print(f"{name:8} {fmt} {groups:5d} groups: held={s['held']} late p50/p99 {s['late_ms_p50']}/{s['late_ms_p99']} "
              f"ms, tick p50/p99 {s['tick_redis_ms_p50']}/{s['tick_redis_ms_p99']} ms, redis CPU {s['server_cpu_cores']} "
              f"clients {s['client_cpu_cores']} cores, {s['bytes_in_mb_s']} MB/s in, "
              f"{s['commands_per_group_tick']} cmds/tick, {s['errors']} errors", flush=True)
        if not s["held"]:
            break
        groups *= 2
    held = [s["groups"] for s in steps if s["held"]]
    return {"topology": name, "checkpoint": fmt, "held_groups": max(held) if held else 0, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-cluster-scale.json")
    ap.add_argument("--procs", type=int, default=2, help="client processes (default 2: the machine's cores)")
    ap.add_argument("--start", type=int, default=16)
    ap.add_argument("--max-groups", type=int, default=1024)
    ap.add_argument("--step-s", type=float, default=STEP_S)
    ap.add_argument("--only", choices=["single", "cluster"], default=None)
    args = ap.parse_args(argv)

    import django

    django.setup()
    from harness import redis_cluster

    if not redis_cluster.available():
        print("redis-server / redis-cli not installed", file=sys.stderr)
        return 2
    p = payloads()
    sizes = {k: len(v) for k, v in p["checkpoint"].items()}
    print(f"checkpoint at {NODES} nodes, full tail windows: v1 {sizes['v1']:,} bytes, v2 (packed) {sizes['v2']:,} "
          f"bytes ({1 - sizes['v2'] / sizes['v1']:.0%} less); to_bytes {p['pack_ms']} ms, from_bytes {p['load_ms']} ms; "
          f"document {len(p['doc']):,} bytes, ingest entry {len(p['rows']):,} bytes", flush=True)
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
                              "checkpoint_bytes": sizes, "to_bytes_ms": p["pack_ms"], "from_bytes_ms": p["load_ms"],
                              "document_bytes": len(p["doc"]), "ingest_entry_bytes": len(p["rows"]), "runs": []}
    with tempfile.TemporaryDirectory(prefix="oa-cluster-scale-") as tmp:
        if args.only in (None, "single"):
            single = SingleRedis(Path(tmp))
            single.start()
            try:
                for fmt in ("v1", "v2"):
                    report["runs"].append(run_topology("single", single, p, fmt, args))
            finally:
                single.stop()
        if args.only in (None, "cluster"):
            cluster = redis_cluster.RedisClusterProcs(Path(tmp) / "cluster")
            cluster.start()
            try:
                report["runs"].append(run_topology("cluster", cluster, p, "v2", args))
            finally:
                cluster.stop()
    held = {f"{r['topology']}/{r['checkpoint']}": r["held_groups"] for r in report["runs"]}
    report["held_groups"] = held
    print("held:", held)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
