"""The chaos probe's load: record batches with unique ``request_id`` s, the gateways that POST them and
re-POST the same body on a 5xx as a shipper does (counted in :class:`~bench.chaos.records.HttpStats`),
and :func:`run`, one probe from set-up to report (the gateways send while
:class:`~bench.chaos.faults.Faults` strikes)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from bench.chaos.cluster import DROPPED_ENV, DROPPED_ENV_PREFIXES, LOOPBACK, ROOT, Cluster
from bench.chaos.faults import Faults, Monitor
from bench.chaos.readback import applied_by_detector, drained
from bench.chaos.records import Batch, HttpStats, make_batch
from bench.chaos.report import _report
from contract import keys

# -------------------------------------------------------------------------------------- gateways


async def _send(client: Any, url: str, headers: dict[str, str], b: Batch, stats: HttpStats,
                give_up_at: float) -> None:
    """POST ``b`` until a 200 or a 4xx (same body every time, as a shipper re-sends its buffer)."""
    import httpx

    delay = 0.25
    while time.monotonic() < give_up_at:
        t = time.perf_counter()
        sent_at = time.time()
        stats.posts += 1
        try:
            resp = await client.post(url, content=b.body, headers=headers)
        except httpx.HTTPError as exc:
            outcome, wait = f"conn:{type(exc).__name__}", delay
        else:
            stats.post_ms.append((time.perf_counter() - t) * 1000)
            outcome = str(resp.status_code)
            if resp.status_code == 200:
                stats.status[outcome] += 1
                out = orjson.loads(resp.content)
                b.final_status, b.accepted, b.duplicates = 200, out["accepted"], out["duplicates"]
                b.rejected, b.errors = out["rejected"], out["errors"]
                b.body = b""  # resolved: free the memory
                return
            if 400 <= resp.status_code < 500:
                stats.status[outcome] += 1
                b.final_status, b.errors = resp.status_code, [resp.text[:300]]
                b.body = b""
                return
            try:
                wait = min(float(resp.headers.get("Retry-After", delay)), 5.0)
            except ValueError:
                wait = delay
        stats.status[outcome] += 1
        stats.failures.append(time.time())
        b.attempts.append(outcome)
        b.attempt_times.append(sent_at)
        await asyncio.sleep(wait)
        delay = min(delay * 2, 2.0)


async def gateways(batches: list[Batch], plan: list[tuple[str, int, int]], tag: str, args: argparse.Namespace,
                   url: str, token: str, stats: HttpStats, give_up_at: float, rng: np.random.Generator,
                   progress: dict[str, float]) -> None:
    """Open-loop producer (one batch every ``batch/rate`` s, built when due, so its timestamps are
    the time of generation) feeding ``--senders`` concurrent senders that retry until resolved."""
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    queue: asyncio.Queue[Batch | None] = asyncio.Queue()
    interval = args.batch / args.rate

    async def producer() -> None:
        start = time.monotonic()
        for i, (group, gi, size) in enumerate(plan):
            due = start + i * interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if time.monotonic() >= give_up_at:
                break
            b = make_batch(len(batches), tag, group, gi, args.nodes, size, rng, time.time())
            batches.append(b)
            await queue.put(b)
        progress["generated_s"] = time.monotonic() - start
        for _ in range(args.senders):
            await queue.put(None)

    async def sender(client: httpx.AsyncClient) -> None:
        while (b := await queue.get()) is not None:
            await _send(client, url, headers, b, stats, give_up_at)

    limits = httpx.Limits(max_connections=args.senders, keepalive_expiry=1.0)
    timeout = httpx.Timeout(30.0, connect=5.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await asyncio.gather(producer(), *(sender(client) for _ in range(args.senders)))


def run(cluster: Cluster, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    t_setup = time.monotonic()
    cluster.init_postgres()
    cluster.start_postgres()
    cluster.start_redis()
    db_url = f"postgres://postgres@{LOOPBACK}:{cluster.pg_port}/outlier_chaos"
    redis_url = f"redis://{LOOPBACK}:{cluster.redis_port}/0"
    if args.redis_failovers > 0:
        redis_url = cluster.start_sentinel_setup()
    env = {k: v for k, v in os.environ.items()
           if k not in DROPPED_ENV and not k.startswith(DROPPED_ENV_PREFIXES)}
    env.update({
        "DJANGO_SETTINGS_MODULE": "outlier_admin.settings", "DATABASE_URL": db_url, "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url, "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": LOOPBACK,
        "SECURE_SSL_REDIRECT": "0", "LOG_LEVEL": "WARNING", "LOG_JSON": "0", "WORKER_METRICS_PORT": "0",
        "AUTO_REGISTER_NODES": "1",
    })
    if args.redis_failovers > 0:  # the broker follows REDIS_URL (kombu's sentinel://); 200 once a replica holds it
        env.pop("CELERY_BROKER_URL")
        env["REDIS_MIN_REPLICAS_ACK"] = "1"
    cluster.env = env
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    os.environ.update(env)

    import psycopg

    with psycopg.connect(f"postgres://postgres@{LOOPBACK}:{cluster.pg_port}/postgres", autocommit=True) as conn:
        conn.execute('CREATE DATABASE "outlier_chaos"')
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=300)

    import django

    django.setup()
    from django.db import connections

    from outlier_admin.control.actions import do_create_group, do_create_token

    tag = secrets.token_hex(3)
    groups = [f"chaos-{tag}-{i}" for i in range(args.groups)]
    for g in groups:  # operators create groups; ingest only registers loopback nodes into them
        do_create_group(g, actor="chaos-probe", reason="chaos probe", auto_register_allow=["127.0.0.0/8"])
    _, token = do_create_token(name=f"chaos-{tag}", scope="ingest", actor="chaos-probe")
    connections.close_all()  # this process never talks to PostgreSQL again until the end

    py = sys.executable
    cluster.spawn("web", [py, "-m", "gunicorn", "outlier_admin.wsgi", "--workers", "2", "--threads", "4",
                          "--worker-class", "gthread", "-b", f"{LOOPBACK}:{cluster.web_port}", "--timeout", "30",
                          "--log-level", "warning"])
    for i in (1, 2):
        cluster.spawn(f"worker-{i}", [py, "-m", "celery", "-A", "outlier_admin", "worker", "--pool", "solo",
                                      "-n", f"chaos-w{i}@%h", "--loglevel", "WARNING"])
    cluster.spawn("beat", [py, "-m", "celery", "-A", "outlier_admin", "beat", "--loglevel", "WARNING",
                           "-s", str(cluster.top / "beat-schedule")])
    return asyncio.run(_probe(cluster, args, groups, tag, token, deadline, t_setup))


async def _until_healthy(base: str) -> None:
    """Up to 30 s for the web server's ``/healthz`` to answer 200 (the probe goes on either way: the
    warm-up's POSTs are retried like any other)."""
    import httpx

    async with httpx.AsyncClient(timeout=10) as probe:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(f"{base}/healthz")).status_code == 200:
                    break
            await asyncio.sleep(0.1)


async def _warm_up(r: Any, args: argparse.Namespace, groups: list[str], tag: str, url: str, token: str,
                   batches: list[Batch], stats: HttpStats, rng: np.random.Generator, deadline: float) -> None:
    """Warm-up (accounted like any batch): one record per node registers every node before the
    first tick, so no record can reach a tick that does not know its node yet. Then up to 90 s for
    every group's first weights document and drained stream."""
    import httpx

    for gi, g in enumerate(groups):
        b = make_batch(len(batches), tag, g, gi, args.nodes, args.nodes, rng, time.time())
        batches.append(b)
        async with httpx.AsyncClient(timeout=30) as client:
            await _send(client, url, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                        b, stats, deadline)
    warm_deadline = time.monotonic() + 90
    while time.monotonic() < warm_deadline:
        with contextlib.suppress(Exception):  # the streams exist once a warm-up batch landed
            if all(r.exists(keys.weights(g)) for g in groups) and all(
                    d["done"] for d in drained(r, groups).values()):
                break
        await asyncio.sleep(0.2)


def _plan(args: argparse.Namespace, groups: list[str]) -> list[tuple[str, int, int]]:
    """``--records`` in batches of ``--batch`` (the last one smaller), the groups in turn:
    ``[(group, its index, batch size)]``."""
    plan = []
    left, i = args.records, 0
    while left > 0:
        size = min(args.batch, left)
        plan.append((groups[i % len(groups)], i % len(groups), size))
        left -= size
        i += 1
    return plan


async def _send_under_faults(cluster: Cluster, args: argparse.Namespace, groups: list[str], monitor: Monitor,
                             t0: float, deadline: float, send: Callable[[], Awaitable[None]]
                             ) -> tuple[list[Faults], float]:
    """The sending phase: the weights monitor and the four fault threads (storage, workers, web,
    pauses) start, ``send`` runs the gateways, then the faults are told to stop. Faults belong to the
    sending phase; one under way completes (nothing is left down), except a storage fault still
    running a minute before ``deadline``, which is aborted. Returns the fault threads and the
    sending's seconds."""
    abort = threading.Event()
    storage = Faults("storage", cluster, args, groups, t0, abort)
    workers = Faults("workers", cluster, args, groups, t0, abort)
    web = Faults("web", cluster, args, groups, t0, abort)
    pauses = Faults("pause", cluster, args, groups, t0, abort)
    for th in (monitor, storage, workers, web, pauses):
        th.start()
    try:
        await send()
    finally:
        sending_s = time.monotonic() - t0
        for th in (storage, workers, web, pauses):
            th.no_more.set()
        storage.join(timeout=max(1.0, deadline - time.monotonic() - 60))
        if storage.is_alive():
            abort.set()
            storage.join(timeout=60)
        workers.join(timeout=30)
        web.join(timeout=5)
        pauses.join(timeout=args.worker_pause_s + 10)
    return [storage, workers, web, pauses], sending_s


async def _drain(r: Any, groups: list[str], deadline: float, stall_s: float) -> tuple[dict[str, dict[str, Any]], float]:
    """Waits until every entry is delivered, acknowledged and applied (each state's ``last_id`` at its
    stream's last id) and the outboxes are empty, or until 20 s before ``deadline``. Returns the
    last state read and the seconds waited."""
    t_drain = time.monotonic()
    state: dict[str, dict[str, Any]] = {}
    last_change, seen = time.monotonic(), None
    while time.monotonic() < deadline - 20:
        try:
            state = drained(r, groups)
            if all(s["done"] and s["outbox"] == 0 for s in state.values()):
                break
            # Nothing pending, nothing to deliver, yet a state behind the stream: its entries were
            # acknowledged without their samples surviving in the state, and no tick will ever
            # read them again. Stop waiting once that has not moved for --drain-stall-s.
            now_seen = json.dumps(state, sort_keys=True, default=str)
            if now_seen != seen:
                seen, last_change = now_seen, time.monotonic()
            elif time.monotonic() - last_change > stall_s:
                break
        except Exception as exc:  # Redis restarting after the last fault: keep waiting
            state = {"error": {"detail": str(exc)}}
        await asyncio.sleep(0.5)
    return state, time.monotonic() - t_drain


async def _probe(cluster: Cluster, args: argparse.Namespace, groups: list[str], tag: str, token: str,
                 deadline: float, t_setup: float) -> dict[str, Any]:
    """The probe once the cluster runs: warm-up, the sending under faults, the drain, the report."""
    r = cluster.client()
    base = f"http://{LOOPBACK}:{cluster.web_port}"
    url = f"{base}/api/v1/ingest/requests"
    rng = np.random.default_rng(args.seed)
    stats = HttpStats()
    batches: list[Batch] = []
    await _until_healthy(base)
    await _warm_up(r, args, groups, tag, url, token, batches, stats, rng, deadline)
    setup_s = time.monotonic() - t_setup

    plan = _plan(args, groups)
    nominal_s = args.records / args.rate
    stop = threading.Event()
    t0 = time.monotonic()
    t0_wall = time.time()
    # Senders give up (batch unresolved) early enough to leave time for the drain and the report.
    give_up_at = deadline - 90
    monitor = Monitor(cluster, groups, stop)
    progress: dict[str, float] = {}
    faults, sending_s = await _send_under_faults(
        cluster, args, groups, monitor, t0, deadline,
        lambda: gateways(batches, plan, tag, args, url, token, stats, give_up_at, rng, progress))

    state, drain_s = await _drain(r, groups, deadline, args.drain_stall_s)
    await asyncio.sleep(1.5)  # one more beat: a last tick publishes, the monitor sees it
    stop.set()
    monitor.join(timeout=5)

    applied, per_node_applied = applied_by_detector(r, groups)
    return _report(args, cluster, groups, tag, batches, stats, applied, per_node_applied, state, monitor,
                   [ev for th in faults for ev in th.events], [th.error for th in faults if th.error],
                   r, setup_s=setup_s, sending_s=sending_s, drain_s=drain_s, nominal_s=nominal_s,
                   t0_wall=t0_wall, generated_s=progress.get("generated_s"))
