"""Bounded loopback fault-injection probe of ingest -> stream -> tick: 0 records lost, 0 applied twice.

What it runs (all on 127.0.0.1, all its own, all stopped at the end; temp dirs removed):

- its own PostgreSQL cluster (``initdb`` into a temp dir with the Debian binaries, ``pg_ctl`` on a free
  port, trust auth; as the ``postgres`` user when run as root, since initdb refuses root) and its own
  ``redis-server`` (``--appendonly yes --appendfsync always``, data dir in the temp dir): the shared
  servers on 5432/6379 are never touched;
- ``manage.py migrate``, the groups (``do_create_group(..., auto_register_allow=["127.0.0.0/8"])``)
  and an ingest token (``do_create_token``); ``AUTO_REGISTER_NODES=1`` so loopback nodes register;
- gunicorn with production settings (random ``SECRET_KEY``, ``ALLOWED_HOSTS=127.0.0.1``,
  ``SECURE_SSL_REDIRECT=0`` because loopback has no TLS), two Celery workers (``--pool solo``, separate
  processes) and one separate beat (so killing a worker never stops the schedule);
- gateways (asyncio + httpx in this process): ``--records`` records at ``--rate`` records/s, in
  batches of ``--batch`` to ``--groups`` groups of ``--nodes`` nodes (node ids ``127.0.0.x:port``),
  every record with a unique ``request_id``. Like a real shipper (``outlier_admin/agent/shipper.py``)
  a gateway keeps a batch and re-POSTs the *same body* on a 5xx or a connection error until it gets a
  200 or a 4xx; generation is open loop (a backlog builds up during outages and drains after);
- faults on a schedule while the gateways send (times relative to the start of the sending; the
  nominal sending time is ``records / rate``):

  * ``kill -9`` of Redis at 15% (``--redis-kills`` > 1: more, spread over the rest), at a moment a
    tick holds a group's lock, restarted on the same data dir after ``--redis-down-s``;
  * with ``--redis-failovers N``, Redis runs replicated instead (a replica and three Sentinels,
    ``redis+sentinel://``, ``REDIS_MIN_REPLICAS_ACK=1``) and its primary is ``kill -9``'d N times;
    Sentinel promotes the replica, every process follows it, and the dead node comes back
    ``--redis-down-s`` later as a replica of the new primary;
  * the private PostgreSQL stopped (``pg_ctl -m fast``, or ``--pg-stop-mode immediate``) at 40% for
    ``--pg-stop-s``, then started again; at least ``--storage-up-s`` between two storage faults;
  * ``kill -9`` of a Celery worker every ``--worker-kill-every-s``, timed for the middle of a tick (a
    worker is ticking while it runs the lease-renewal thread of a tick lock), restarted after
    ``--worker-restart-s``;
  * optional, off by default: ``kill -9`` of a gunicorn worker every ``--web-kill-every-s`` (answers
    lost after the point of acceptance: the duplicates path), and ``SIGSTOP`` of a ticking Celery
    worker for ``--worker-pause-s`` every ``--worker-pause-every-s`` (a stalled host: its tick lease
    lapses while it holds the group's entries, then it resumes).

At the end the gateways stop, the probe waits until every group's stream is drained (consumer group
``ticks``: no pending entry, nothing left to deliver, and the detector state's ``last_id`` at the
stream's last id), then counts.

What "lost" and "applied twice" mean here
-----------------------------------------
Request ids are unique across the whole run, so within one retried body a ``duplicates`` count in
the final 200 can only mean "these records already landed through an earlier attempt of this same
body" (an attempt whose answer was lost: a connection error or client timeout after the server's
MULTI/EXEC, or a 5xx after it — the contract says a 5xx accepted nothing, so a duplicate after 5xx
answers only is reported apart, as a contract violation, not as a loss; so are duplicates in the
answer to a body's first POST, which only a retry inside the server can produce). Hence:

- *landed* = sum over the batches that got a 200 of ``accepted + duplicates``: each of those records
  is in its group's stream exactly once (the dedup sets, :func:`outlier_admin.keys.dedup`, are written in
  the same MULTI as the rows; the probe checks that every landed id is in them and no other id is);
- *applied* = sum over groups of the detector's ``accepted_total`` (detector state in Redis): every
  row the ticks handed to the detector and it accepted. Rows carry no request id, so the detector
  cannot say which records it applied;
- ``lost = landed - applied`` and ``applied_twice = applied - landed`` (each floored at 0), per group
  and in total. Per group a loss and a double application could cancel out; the per-node check
  (records landed per node vs. the node's decode-EMA sample count, exact while no node was reset by
  a recovery from quarantine) would catch that unless they also cancelled within one node.
- ``http_accepted`` (the ``accepted`` of the 200s alone) is reported too: it differs from *landed*
  by exactly the duplicates that came back after a lost answer. Comparing ``applied`` with it alone
  would count every such record as "applied twice".

A batch still without a 200 when the time runs out is *unresolved*: its records may or may not have
landed, which the dedup sets tell; the verdict is then not a pass. So is a stream whose consumer group
has nothing pending or undelivered while the state's ``last_id`` stays behind the stream's last entry
(``--drain-stall-s``): entries acknowledged whose samples are not in the state.

Not a test: no timed assertions. It prints the figures and writes them to ``--out``. Development::

    .venv/bin/python bench/chaos_probe.py --records 20000 --rate 2000 --pg-stop-s 5 \\
        --worker-kill-every-s 5 --out reports/chaos-probe-small.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from outlier_admin import keys  # noqa: E402  (after the path: runs as a script too)

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"
# Environment of the outer shell that could point a child at the shared services (or relax the
# settings): dropped, then set explicitly to the private ones.
DROPPED_ENV_PREFIXES = ("DJANGO_", "OUTLIER_", "CELERY_", "PG", "ALERT", "GUNICORN_", "PROMETHEUS_")
SENTINEL_MASTER = "chaos"
DROPPED_ENV = {"DATABASE_URL", "REDIS_URL", "OUTLIER_TESTING", "WEB_CONCURRENCY", "PORT", "METRICS_TOKEN"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def _id_tuple(raw: bytes | str | None) -> tuple[int, int]:
    if not raw:
        return (0, 0)
    text = raw.decode() if isinstance(raw, bytes) else raw
    a, _, b = text.partition("-")
    return int(a), int(b or 0)


# --------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen | None = None
    log: Path | None = None
    starts: int = 0
    killed_by_probe: int = 0
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)


class Cluster:
    """Everything the probe starts: a temp dir, a PostgreSQL cluster, a Redis, gunicorn, Celery.

    Every child runs in its own session so that :meth:`close` can end it (and only it) by its id,
    including gunicorn's forked workers."""

    def __init__(self, keep_logs: str | None) -> None:
        self.top = Path(tempfile.mkdtemp(prefix="chaos-probe-"))
        self.keep_logs = keep_logs
        self.logs = self.top / "logs"
        self.logs.mkdir()
        self.pg_user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:  # initdb refuses to run as root: the cluster belongs to postgres
            self.pg_user = pwd.getpwnam("postgres")
            os.chown(self.top, self.pg_user.pw_uid, self.pg_user.pw_gid)
        self.pg_bin = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)[-1])
        self.pg_data = self.top / "pgdata"
        self.pg_port = _free_port()
        self.redis_dir = self.top / "redis"
        self.redis_dir.mkdir()
        self.redis_port = _free_port()
        # --redis-failovers: a replica and three Sentinels beside it (start_sentinel_setup)
        self.replica_port: int | None = None
        self.sentinel_ports: list[int] = []
        self.web_port = _free_port()
        self.procs: dict[str, Proc] = {}
        self.env: dict[str, str] = {}
        # The monitor (restarts of crashed children) and the fault threads (kills) share the children.
        self.lock = threading.RLock()

    # -- PostgreSQL
    def _pg(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        kwargs: dict[str, Any] = {}
        if self.pg_user is not None:
            kwargs = {"user": self.pg_user.pw_uid, "group": self.pg_user.pw_gid, "extra_groups": []}
        return subprocess.run([str(self.pg_bin / argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=timeout, cwd=self.top, **kwargs)

    def init_postgres(self) -> None:
        res = self._pg("initdb", "-D", str(self.pg_data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                       "--locale=C", "--no-sync")
        if res.returncode:
            raise RuntimeError(f"initdb failed: {res.stderr[-2000:]}")

    def start_postgres(self) -> None:
        opts = (f"-p {self.pg_port} -c listen_addresses={LOOPBACK} -c unix_socket_directories={self.top} "
                "-c max_connections=60 -c shared_buffers=64MB")
        res = self._pg("pg_ctl", "-D", str(self.pg_data), "-l", str(self.top / "postgres.log"), "-w", "-t", "90",
                       "-o", opts, "start")
        if res.returncode:
            raise RuntimeError(f"pg_ctl start failed: {res.stdout[-1000:]} {res.stderr[-1000:]}")

    def stop_postgres(self, mode: str) -> None:
        res = self._pg("pg_ctl", "-D", str(self.pg_data), "-m", mode, "-w", "-t", "60", "stop")
        if res.returncode:
            raise RuntimeError(f"pg_ctl stop failed: {res.stderr[-1000:]}")

    def postgres_ready(self) -> bool:
        res = self._pg("pg_isready", "-q", "-h", LOOPBACK, "-p", str(self.pg_port), timeout=10)
        return res.returncode == 0

    def _kill_postgres(self) -> None:
        if not (self.pg_data / "postmaster.pid").exists():
            return
        with contextlib.suppress(Exception):
            self.stop_postgres("immediate")
        pidfile = self.pg_data / "postmaster.pid"
        if pidfile.exists():  # pg_ctl could not stop it: end the postmaster we started, by its pid
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)

    # -- children
    def spawn(self, name: str, argv: list[str] | None = None, env: dict[str, str] | None = None) -> Proc:
        with self.lock:
            proc = self.procs.get(name)
            if proc is None:
                assert argv is not None
                proc = self.procs[name] = Proc(name, argv, log=self.logs / f"{name}.log")
            assert proc.log is not None
            out = open(proc.log, "ab")  # noqa: SIM115 - the child owns it; closed when we close it
            proc.popen = subprocess.Popen(proc.argv, cwd=ROOT, env=env or self.env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            out.close()
            proc.starts += 1
            return proc

    def kill(self, name: str) -> None:
        """``kill -9`` of one child we started (its whole session: gunicorn's workers too)."""
        with self.lock:
            proc = self.procs[name]
            if proc.popen is None or proc.popen.poll() is not None:
                return
            proc.killed_by_probe += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)
            proc.popen = None  # down on purpose: not an unexpected exit

    def check_exits(self, restart: set[str]) -> None:
        """Record children that died without us killing them; restart those in ``restart``."""
        with self.lock:
            for name, proc in list(self.procs.items()):
                if proc.popen is not None and proc.popen.poll() is not None:
                    proc.unexpected_exits.append({"at": round(time.time(), 2), "code": proc.popen.returncode})
                    proc.popen = None
                    if name in restart:
                        self.spawn(name)

    def start_redis(self) -> None:
        argv = ["redis-server", "--port", str(self.redis_port), "--bind", LOOPBACK, "--dir", str(self.redis_dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--logfile", str(self.redis_dir / "redis.log")]
        self.spawn("redis", argv)

    def redis_argv(self, port: int, data: Path, replica_of: int | None = None) -> list[str]:
        argv = ["redis-server", "--port", str(port), "--bind", LOOPBACK, "--dir", str(data),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--logfile", str(data / "redis.log"), "--repl-diskless-sync-delay", "0"]
        return argv + (["--replicaof", LOOPBACK, str(replica_of)] if replica_of else [])

    def start_sentinel_setup(self) -> str:
        """A replica of the primary and three Sentinels (quorum 2, a failover in about 2 s); returns
        the control plane's ``redis+sentinel://`` URL."""
        self.replica_port = _free_port()
        (self.top / "redis-replica").mkdir()
        self.spawn("redis-replica", self.redis_argv(self.replica_port, self.top / "redis-replica", self.redis_port))
        self.sentinel_ports = [_free_port() for _ in range(3)]
        for i, port in enumerate(self.sentinel_ports):
            conf = self.top / f"sentinel-{i}.conf"
            conf.write_text(f"port {port}\nbind {LOOPBACK}\ndir {self.top}\n"
                            f"sentinel monitor {SENTINEL_MASTER} {LOOPBACK} {self.redis_port} 2\n"
                            f"sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n"
                            f"sentinel failover-timeout {SENTINEL_MASTER} 3000\n")
            self.spawn(f"sentinel-{i}", ["redis-server", str(conf), "--sentinel"])
        hosts = ",".join(f"{LOOPBACK}:{p}" for p in self.sentinel_ports)
        url = f"redis+sentinel://{hosts}/{SENTINEL_MASTER}/0"
        from outlier_admin.gateway_client import sentinel_problem

        deadline = time.monotonic() + 30  # every process refuses to start until a Sentinel names the primary
        while (problem := sentinel_problem(url)) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(problem)
            time.sleep(0.2)
        return url

    def client(self) -> Any:
        """The probe's own Redis client: the primary, wherever the Sentinels say it is."""
        if not self.sentinel_ports:
            return _redis_client(self.redis_port)
        from redis.sentinel import Sentinel

        return Sentinel([(LOOPBACK, p) for p in self.sentinel_ports], socket_timeout=2,
                        socket_connect_timeout=1).master_for(SENTINEL_MASTER, socket_timeout=2,
                                                             socket_connect_timeout=1)

    def close(self) -> None:
        # The application first, Redis after it (a worker still finishing a task needs it), then
        # PostgreSQL; each politely (SIGTERM), then SIGKILL of a session still alive.
        storage = ("redis", "redis-replica", "sentinel-0", "sentinel-1", "sentinel-2")
        app = [p for n, p in self.procs.items() if n not in storage]
        self._stop([p for p in reversed(app)])
        self._stop([p for n, p in self.procs.items() if n in storage])
        self._kill_postgres()
        if self.keep_logs:
            dest = Path(self.keep_logs)
            dest.mkdir(parents=True, exist_ok=True)
            for src in [*self.logs.glob("*.log"), self.top / "postgres.log", self.redis_dir / "redis.log"]:
                if src.exists():
                    shutil.copy(src, dest / src.name)
        shutil.rmtree(self.top, ignore_errors=True)

    @staticmethod
    def _stop(procs: list[Proc]) -> None:
        for proc in procs:
            if proc.popen is not None and proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Still alive, so its session id is still ours: SIGKILL the whole session.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=5)


def _version_key(path: str) -> tuple[int, ...]:
    parts = Path(path).parent.name.split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def _log_summary(cluster: Cluster) -> dict[str, Any]:
    """Per child log: tracebacks, ERROR/CRITICAL lines and the distinct exception lines (last lines
    of tracebacks), so a crash shows up in the report without keeping the logs."""
    out: dict[str, Any] = {}
    for path in sorted(cluster.logs.glob("*.log")):
        text = path.read_text(errors="replace").splitlines()
        excs: Counter[str] = Counter()
        in_tb = False
        for line in text:
            if line.startswith("Traceback"):
                in_tb = True
                continue
            if in_tb and line and not line.startswith((" ", "\t")):
                excs[line[:200]] += 1
                in_tb = False
        out[path.stem] = {
            "tracebacks": sum(1 for ln in text if ln.startswith("Traceback")),
            "error_lines": sum(1 for ln in text if "ERROR" in ln or "CRITICAL" in ln),
            "exceptions": dict(excs.most_common(8)),
            # redis_conn.GroupLock: a tick went on after its lease lapsed (another may hold it).
            "tick_lease_lost_warnings": sum(1 for ln in text if "lease lost while held" in ln),
            "degraded_tick_warnings": sum(1 for ln in text if "without PostgreSQL" in ln),
        }
    return out


# ---------------------------------------------------------------------------------------- records


@dataclass
class Batch:
    no: int
    group: str
    n: int
    node_counts: dict[str, int]
    body: bytes = b""
    attempts: list[str] = field(default_factory=list)  # outcome of every attempt but the last 200/4xx
    attempt_times: list[float] = field(default_factory=list)  # when each of those was sent (wall)
    final_status: int | None = None
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[Any] = field(default_factory=list)


def node_id(group_index: int, node_index: int) -> str:
    """Loopback only: ``127.0.0.x:port``, unique across groups."""
    return f"127.0.0.{1 + node_index % 254}:{8000 + 10 * group_index + node_index // 254}"


def make_batch(no: int, tag: str, group: str, group_index: int, nodes: int, size: int,
               rng: np.random.Generator, now: float) -> Batch:
    """``size`` healthy records spread over the group's nodes (latency as in the test helpers:
    ``(prompt*0.25 + completion) * 20 ms`` with 8% noise), each with a run-unique ``request_id``."""
    p = rng.integers(50, 2000, size)
    c = rng.integers(20, 400, size)
    noise = rng.lognormal(0.0, 0.08, size)
    total = (p * 0.25 + c) * 20.0 * noise
    ttft = p * 0.25 * 20.0 * noise * 0.9
    ts = now - rng.uniform(0, 0.9, size)
    recs = []
    counts: Counter[str] = Counter()
    for k in range(size):
        node = node_id(group_index, (k + no) % nodes)
        counts[node] += 1
        recs.append({
            "ts": float(ts[k]), "node": node, "group": group, "prompt_tokens": int(p[k]),
            "completion_tokens": int(c[k]), "ttft_ms": float(ttft[k]), "total_ms": float(total[k]),
            "status": 200, "request_id": f"{tag}-{no}-{k}",
        })
    return Batch(no=no, group=group, n=size, node_counts=dict(counts), body=orjson.dumps(recs))


def batch_ids(tag: str, b: Batch) -> list[str]:
    return [f"{tag}-{b.no}-{k}" for k in range(b.n)]


# -------------------------------------------------------------------------------------- gateways


@dataclass
class HttpStats:
    posts: int = 0
    status: Counter = field(default_factory=Counter)  # "200", "503", "conn:ReadTimeout", ...
    failures: list[float] = field(default_factory=list)  # wall times of non-200 answers
    post_ms: list[float] = field(default_factory=list)


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


# ------------------------------------------------------------------------------- monitor & faults


def _redis_client(port: int) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # The probe's own reads must fail fast during a Redis outage (no redis-py retries).
    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))


class Monitor(threading.Thread):
    """Polls every group's weights document (as a gateway would) and the children's health."""

    def __init__(self, cluster: Cluster, groups: list[str], stop: threading.Event, period_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="monitor")
        self.cluster, self.groups, self.stop, self.period_s = cluster, groups, stop, period_s
        # Per group, every distinct document seen: (poll time, version, generated_at, stale_after_s).
        self.docs: dict[str, list[tuple[float, int, float, float]]] = {g: [] for g in groups}
        self.max_age: dict[str, tuple[float, float]] = {g: (0.0, 0.0) for g in groups}  # (age, at)
        self.states: Counter[str] = Counter()

    def run(self) -> None:
        import redis

        r = self.cluster.client()
        last: dict[str, tuple[int, float] | None] = dict.fromkeys(self.groups)
        while not self.stop.wait(self.period_s):
            now = time.time()
            for g in self.groups:
                try:
                    raw = r.get(keys.weights(g))
                except redis.RedisError:
                    raw = None  # a gateway keeps its last document while Redis is down
                if raw:
                    doc = orjson.loads(raw)
                    key = (doc["version"], doc["generated_at"])
                    if key != last[g]:
                        last[g] = key
                        self.states.update(n["state"] for n in doc["nodes"])
                        self.docs[g].append((now, doc["version"], doc["generated_at"], doc["stale_after_s"]))
                if last[g] is not None:
                    age = now - last[g][1]
                    if age > self.max_age[g][0]:
                        self.max_age[g] = (age, now)
            try:
                self.cluster.check_exits(restart={"web", "beat", "worker-1", "worker-2"})
            except Exception as exc:  # a failed restart is reported by the next check, never fatal here
                print(f"monitor: restart failed: {exc}", file=sys.stderr)


class Faults(threading.Thread):
    """One fault schedule, by ``kind``: ``storage`` (Redis kills, the PostgreSQL stop), ``workers``
    (Celery worker kills), ``web`` (gunicorn worker kills), ``pause`` (Celery worker stalls)."""

    def __init__(self, kind: str, cluster: Cluster, args: argparse.Namespace, groups: list[str],
                 start: float, abort: threading.Event) -> None:
        super().__init__(daemon=True, name=f"faults-{kind}")
        self.kind, self.cluster, self.args, self.groups = kind, cluster, args, groups
        self.start_at = start
        # ``no_more``: the sending is over, start no new fault (one under way still completes, so
        # nothing is left down); ``abort``: the overall timeout, cut an outage short too.
        self.no_more, self.abort = threading.Event(), abort
        self.events: list[dict[str, Any]] = []
        self.error: str | None = None

    def _sleep_until(self, t: float) -> bool:
        """Wait for the next fault; False when no more faults are wanted."""
        return not self.no_more.wait(max(0.0, t - time.monotonic())) and not self.abort.is_set()

    def _periodic(self, at: float) -> bool:
        """Wait for a periodic fault due ``at`` s after the start; none after the nominal sending
        time (a backlog delayed by the faults must be able to drain)."""
        return at < self.args.records / self.args.rate and self._sleep_until(self.start_at + at)

    def rel(self, t: float | None = None) -> float:
        return round((time.monotonic() if t is None else t) - self.start_at, 2)

    def run(self) -> None:
        try:
            if self.kind == "storage":
                self._storage()
            elif self.kind == "web":
                self._web()
            elif self.kind == "pause":
                self._pauses()
            else:
                self._workers()
        except Exception as exc:  # reported in the JSON: a probe that cannot inject is no proof
            self.error = f"{type(exc).__name__}: {exc}"

    def _storage(self) -> None:
        """The first Redis kill at 15% of the nominal sending time, PostgreSQL stopped at 40%, further
        Redis kills (``--redis-kills``) spread over the rest; one at a time, in time order."""
        nominal = self.args.records / self.args.rate
        plan: list[tuple[float, str]] = []
        if self.args.redis_kills > 0:
            n = self.args.redis_kills
            plan += [(max(2.0, (0.15 + 0.8 * i / max(n, 1)) * nominal), "redis") for i in range(n)]
        if self.args.redis_failovers > 0:
            n = self.args.redis_failovers
            plan += [(max(2.0, (0.2 + 0.7 * i / n) * nominal), "failover") for i in range(n)]
        if self.args.pg_stop_s > 0:
            plan.append((max(4.0, 0.4 * nominal), "postgres"))
        ready_at = 0.0
        for at, what in sorted(plan):
            # At least --storage-up-s of service between two storage faults: back-to-back outages
            # would just be one long outage.
            if not self._sleep_until(max(self.start_at + at, ready_at)):
                return
            fault = {"redis": self._kill_redis, "failover": self._fail_over, "postgres": self._stop_postgres}[what]
            self.events.append(fault())
            up_s = self.args.storage_up_s
            ready_at = time.monotonic() + (min(10.0, 0.1 * nominal) if up_s is None else up_s)

    def _kill_redis(self) -> dict[str, Any]:
        import redis

        # The hardest moment for the tick: kill while a group's tick holds its lock (wait up to 2 s).
        r = self.cluster.client()
        locks = [keys.tick_lock(g) for g in self.groups]
        held: list[str] = []
        t0 = time.monotonic()
        while time.monotonic() < t0 + 2.0 and not held:
            with contextlib.suppress(redis.RedisError):
                held = [g for g, v in zip(self.groups, r.mget(locks), strict=True) if v]
            time.sleep(0.005)
        t0 = time.monotonic()
        self.cluster.kill("redis")  # kill -9: whatever was fsynced to the AOF is all there is
        killed = time.monotonic()
        self.abort.wait(self.args.redis_down_s)
        self.cluster.start_redis()
        up = None
        while time.monotonic() < killed + 120:
            try:
                if r.ping():
                    up = time.monotonic()
                    break
            except redis.RedisError:  # still starting or loading the AOF
                pass
            time.sleep(0.05)
        return {"fault": "redis_kill_9", "at_s": self.rel(t0), "tick_locks_held_at_kill": held,
                "restarted_after_s": round(self.args.redis_down_s, 2),
                "lasted_s": round(up - killed, 2) if up else None,
                "aof_bytes_at_restart": _dir_size(self.cluster.redis_dir)}

    def _fail_over(self) -> dict[str, Any]:
        """``kill -9`` of the Redis primary with Sentinel watching: the replica is promoted, the
        control plane follows it; the dead node comes back ``--redis-down-s`` later as its replica."""
        import redis

        c = self.cluster
        sentinel = _redis_client(c.sentinel_ports[0])

        def named() -> int | None:
            with contextlib.suppress(redis.RedisError, TypeError, IndexError):
                return int(sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER)[1])
            return None

        old = named()
        assert c.replica_port is not None and old in (c.redis_port, c.replica_port), old
        name, data = ("redis", c.redis_dir) if old == c.redis_port else ("redis-replica", c.top / "redis-replica")
        t0 = time.monotonic()
        c.kill(name)
        new = promoted = None
        while time.monotonic() < t0 + 60 and not self.abort.is_set():
            new = named()
            if new is not None and new != old:
                promoted = time.monotonic()
                break
            time.sleep(0.05)
        self.abort.wait(max(0.0, self.args.redis_down_s - (time.monotonic() - t0)))
        if new is not None and new != old:
            with c.lock:  # back as a replica of the new primary (as an operator replaces a node)
                c.procs[name].argv = c.redis_argv(old, data, replica_of=new)
                c.spawn(name)
        return {"fault": "redis_primary_kill_9_sentinel", "at_s": self.rel(t0), "old_primary": old,
                "new_primary": new, "promoted_after_s": round(promoted - t0, 2) if promoted else None,
                # no primary from the kill to the promotion: the outage the clients saw
                "lasted_s": round(promoted - t0, 2) if promoted else None,
                "restarted_as_replica_after_s": round(time.monotonic() - t0, 2)}

    def _stop_postgres(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.cluster.stop_postgres(self.args.pg_stop_mode)
        stopped = time.monotonic()
        self.abort.wait(self.args.pg_stop_s)
        self.cluster.start_postgres()  # pg_ctl -w: returns once it accepts connections
        up = time.monotonic() if self.cluster.postgres_ready() else None
        return {"fault": f"postgres_stop_{self.args.pg_stop_mode}", "at_s": self.rel(t0),
                "stop_took_s": round(stopped - t0, 2), "lasted_s": round(up - t0, 2) if up else None}

    def _workers(self) -> None:
        every = self.args.worker_kill_every_s
        k = 0
        while every > 0 and self._periodic(every * (k + 0.5)):
            self.events.append(self._kill_worker(k))
            k += 1

    def _pauses(self) -> None:
        every = self.args.worker_pause_every_s
        k = 0
        while every > 0 and self._periodic(every * (k + 0.6)):
            self.events.append(self._pause_worker(k))
            k += 1

    def _pick_ticking(self, k: int) -> tuple[str, int, str, dict[str, bytes]] | None:
        """A worker in the middle of a tick: ``(name, pid, how it was chosen, {group: lock token})``.

        A tick holds its group's lock with a lease-renewing thread (redis_conn.GroupLock), so a solo
        worker is ticking exactly while it has one thread more than when idle: learn each worker's
        idle count (the minimum over ~1.2 s, ticks being shorter than the 1 s beat), then take the
        first worker seen above it while a lock is held (up to 4 s more); else the one burning CPU."""
        import redis

        r = self.cluster.client()
        locks = [keys.tick_lock(g) for g in self.groups]
        names = ["worker-1", "worker-2"]
        with self.cluster.lock:
            pids = {n: self.cluster.procs[n].popen.pid for n in names if self.cluster.procs[n].popen is not None}
        if not pids:
            return None

        def held_locks() -> dict[str, bytes]:
            with contextlib.suppress(redis.RedisError):
                return {g: v for g, v in zip(self.groups, r.mget(locks), strict=True) if v}
            return {}

        base = {n: _threads(p) for n, p in pids.items()}
        t0 = time.monotonic()
        while time.monotonic() < t0 + 5.2:
            now_threads = {n: _threads(p) for n, p in pids.items()}
            if time.monotonic() < t0 + 1.2:
                base = {n: min(base[n], now_threads[n]) for n in pids}
            elif ticking := [n for n in pids if now_threads[n] > base[n]]:
                # Confirm with Redis: an extra thread without a held lock is something else
                # (e.g. the broker connection being re-established after a Redis outage).
                held = held_locks()
                if held:
                    victim = ticking[k % len(ticking)]
                    return victim, pids[victim], "lease_thread", held
            time.sleep(0.005)
        cpu0 = {n: _cpu_seconds(p) for n, p in pids.items()}
        time.sleep(0.06)
        busy = {n: _cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
        victim = max(busy, key=lambda n: (busy[n], n == names[k % 2]))
        return victim, pids[victim], "cpu", held_locks()

    def _kill_worker(self, k: int) -> dict[str, Any]:
        import redis

        picked = self._pick_ticking(k)
        if picked is None:
            return {"fault": "worker_kill_9", "at_s": self.rel(), "skipped": "no live worker"}
        victim, _pid, how, held = picked
        killed_at = time.monotonic()
        self.cluster.kill(victim)
        # A live holder releases its lock within a tick (well under a second); a lock still held
        # by the same token 1.5 s later belonged to the dead worker, and will lapse with its lease.
        time.sleep(1.5)
        died_holding = []
        with contextlib.suppress(redis.RedisError):
            r = self.cluster.client()
            later = dict(zip(self.groups, r.mget([keys.tick_lock(g) for g in self.groups]), strict=True))
            died_holding = [g for g, tok in held.items() if later.get(g) == tok]
        time.sleep(max(0.0, self.args.worker_restart_s - 1.5))
        self.cluster.spawn(victim)
        return {"fault": "worker_kill_9", "at_s": self.rel(killed_at), "victim": victim, "chosen_by": how,
                "locks_held_at_kill": sorted(held), "died_holding_lock_of": died_holding,
                "restarted_after_s": round(time.monotonic() - killed_at, 2)}

    def _pause_worker(self, k: int) -> dict[str, Any]:
        """SIGSTOP a ticking worker for ``--worker-pause-s`` (a stalled host, a long GC pause), then
        SIGCONT: its lease lapses meanwhile and another worker takes the group over; the paused
        tick then resumes where it stopped, unaware. The detector's ``accepted_total`` of the
        group is read before, at the end of and after the pause: a drop after the resume means the
        resumed tick overwrote the state its successor had stored (a lost update)."""
        import redis

        picked = self._pick_ticking(k)
        if picked is None:
            return {"fault": "worker_pause", "at_s": self.rel(), "skipped": "no live worker"}
        victim, pid, how, held = picked
        r = self.cluster.client()

        def snapshot() -> dict[str, tuple[int, int]]:
            out: dict[str, tuple[int, int]] = {}
            for g in self.groups:
                with contextlib.suppress(redis.RedisError, ValueError, KeyError, TypeError):
                    version = orjson.loads(r.get(keys.weights(g)))["version"]
                    out[g] = (version, applied_by_detector(r, [g])[0][g])
            return out

        before = snapshot()
        paused_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)  # the solo worker we started (one process)
        try:
            # The paused worker's lock keeps its token until the lease lapses; the other worker's
            # changes within a tick: what is still held after 1.5 s is the victim's group.
            time.sleep(min(1.5, self.args.worker_pause_s))
            mine: list[str] = []
            with contextlib.suppress(redis.RedisError):
                later = dict(zip(self.groups, r.mget([keys.tick_lock(g) for g in self.groups]),
                                 strict=True))
                mine = [g for g, tok in held.items() if later.get(g) == tok]
            time.sleep(max(0.0, self.args.worker_pause_s - 1.5))
            during = snapshot()
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile by the kill schedule
                os.kill(pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        time.sleep(2.0)  # the resumed tick finishes (or not) its stale work
        after = snapshot()
        groups = {}
        for g in mine:
            (v0, a0), (v1, a1), (v2, a2) = before.get(g, (0, 0)), during.get(g, (0, 0)), after.get(g, (0, 0))
            groups[g] = {"versions": [v0, v1, v2], "accepted_total": [a0, a1, a2],
                         "taken_over_during_pause": v1 > v0, "accepted_total_went_down": a2 < a1}
        return {"fault": "worker_pause", "at_s": self.rel(paused_at), "victim": victim, "chosen_by": how,
                "paused_s": round(resumed_at - paused_at, 2), "locks_held_at_pause": sorted(held),
                "victim_held_lock_of": groups}

    def _web(self) -> None:
        """``kill -9`` of one gunicorn worker (the master forks a new one): requests in flight lose
        their answer after, or before, their MULTI/EXEC — the path of duplicates after a retry."""
        every = self.args.web_kill_every_s
        k = 0
        while every > 0 and self._periodic(every * (k + 0.75)):
            with self.cluster.lock:
                master = self.cluster.procs["web"].popen
                kids = _children(master.pid) if master is not None else []
                if kids:
                    os.kill(kids[k % len(kids)], signal.SIGKILL)  # a worker of the gunicorn we started
            self.events.append({"fault": "web_worker_kill_9", "at_s": self.rel(),
                                "victim_pid": kids[k % len(kids)] if kids else None})
            k += 1


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return sorted(out)


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------- accounting


def drained(r: Any, groups: list[str]) -> dict[str, dict[str, Any]]:
    """Per group: is everything in its stream delivered, acknowledged and applied?"""
    out = {}
    for g in groups:
        key = keys.stream(g)
        info = r.xinfo_stream(key)
        last = info["last-generated-id"]
        grp = next((x for x in r.xinfo_groups(key) if x["name"] in (b"ticks", "ticks")), None)
        state_last = r.hget(keys.state(g), "last_id")
        pending = grp["pending"] if grp else None
        delivered = grp["last-delivered-id"] if grp else None
        out[g] = {
            "pending": pending,
            "undelivered": grp is None or _id_tuple(delivered) < _id_tuple(last),
            "state_behind": _id_tuple(state_last) < _id_tuple(last),
            "xlen": info["length"], "entries_added": info.get("entries-added"),
            "outbox": r.llen(keys.outbox(g)),
        }
        out[g]["done"] = pending == 0 and not out[g]["undelivered"] and not out[g]["state_behind"]
    return out


def applied_by_detector(r: Any, groups: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """``({group: accepted_total}, {node: decode EMA sample count})`` from the detector states."""
    from detector import GroupDetector

    totals, per_node = {}, {}
    for g in groups:
        raw = r.hget(keys.state(g), "detector")
        if not raw:
            totals[g] = 0
            continue
        gd = GroupDetector.from_bytes(raw)
        totals[g] = int(gd.accepted_total)
        for name, count in zip(gd.node_ids, gd.ewma["decode"].count.tolist(), strict=True):
            per_node[name] = int(count)
    return totals, per_node


def dedup_ids(r: Any, group: str) -> set[str]:
    ids: set[str] = set()
    for key in r.scan_iter(match=keys.dedup(group, "*"), count=1000):
        ids.update(m.decode() for m in r.sscan_iter(key, count=5000))
    return ids


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _fault_windows(faults: list[dict[str, Any]], failures: list[float], t0_wall: float) -> None:
    """Client-side view of each storage fault: first and last non-200 answer within it (+10 s)."""
    for f in faults:
        if f.get("lasted_s") is None or f["fault"] == "worker_kill_9":
            continue
        start = t0_wall + f["at_s"]
        end = start + f["lasted_s"] + 10
        hits = [t for t in failures if start <= t <= end]
        f["client_failures"] = len(hits)
        f["client_failure_span_s"] = round(hits[-1] - hits[0], 2) if hits else 0.0


# ------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000, help="records sent in all (default 400000)")
    ap.add_argument("--rate", type=float, default=4000.0, help="records per second generated (default 4000)")
    ap.add_argument("--batch", type=int, default=250, help="records per POST (default 250)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=16, help="nodes per group")
    ap.add_argument("--senders", type=int, default=8, help="concurrent gateway senders")
    ap.add_argument("--pg-stop-s", type=float, default=30.0, help="seconds PostgreSQL stays stopped (0: no stop)")
    ap.add_argument("--pg-stop-mode", choices=["fast", "immediate"], default="fast",
                    help="pg_ctl stop mode: fast (clean) or immediate (crash, recovery on start)")
    ap.add_argument("--redis-down-s", type=float, default=5.0, help="seconds between Redis kill -9 and restart")
    ap.add_argument("--redis-kills", type=int, default=1, help="how many times Redis is killed (0: never)")
    ap.add_argument("--redis-failovers", type=int, default=0,
                    help="run Redis with a replica and three Sentinels (redis+sentinel://, REDIS_MIN_REPLICAS_ACK=1) "
                         "and kill -9 the primary this many times (then --redis-kills is 0)")
    ap.add_argument("--storage-up-s", type=float, default=None,
                    help="minimum seconds of service between two Redis/PostgreSQL faults "
                         "(default: 10, or 10%% of the nominal sending time if less)")
    ap.add_argument("--worker-kill-every-s", type=float, default=20.0, help="kill -9 a Celery worker this often (0: never)")
    ap.add_argument("--web-kill-every-s", type=float, default=0.0,
                    help="also kill -9 a gunicorn worker this often (0, the default: never)")
    ap.add_argument("--worker-pause-every-s", type=float, default=0.0,
                    help="also SIGSTOP a ticking worker this often (0, the default: never)")
    ap.add_argument("--worker-pause-s", type=float, default=8.0,
                    help="seconds a paused worker stays stopped (beyond TICK_LOCK_TTL_MS: its lease lapses)")
    ap.add_argument("--worker-restart-s", type=float, default=3.0, help="seconds before a killed worker restarts")
    ap.add_argument("--drain-stall-s", type=float, default=60.0,
                    help="stop waiting for the drain when the streams and states have not moved for this long")
    ap.add_argument("--timeout", type=float, default=1200.0, help="overall bound (seconds) of the whole probe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-logs", default=None, help="copy the children's logs to this directory at the end")
    ap.add_argument("--out", default="reports/chaos-probe.json")
    args = ap.parse_args()
    if args.redis_failovers > 0:
        args.redis_kills = 0  # the single-Redis kill and the failover are different set-ups
    deadline = time.monotonic() + args.timeout

    # SIGTERM -> SystemExit so the finally below still stops everything we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = Cluster(args.keep_logs)
    figures: dict[str, Any] = {}
    try:
        figures = _run(cluster, args, deadline)
    except Exception:  # still report (and clean up): a probe that broke is a finding too
        figures = {"verdict": "ERROR", "error": traceback.format_exc()[-4000:]}
    finally:
        with contextlib.suppress(Exception):
            figures.setdefault("logs", _log_summary(cluster))
        cluster.close()
    print(json.dumps(figures, indent=2))
    print(_summary(figures))
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures.get("verdict") == "PASS" else 1


def _run(cluster: Cluster, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
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


async def _probe(cluster: Cluster, args: argparse.Namespace, groups: list[str], tag: str, token: str,
                 deadline: float, t_setup: float) -> dict[str, Any]:
    import httpx

    r = cluster.client()
    base = f"http://{LOOPBACK}:{cluster.web_port}"
    url = f"{base}/api/v1/ingest/requests"
    rng = np.random.default_rng(args.seed)
    stats = HttpStats()
    batches: list[Batch] = []
    async with httpx.AsyncClient(timeout=10) as probe:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(f"{base}/healthz")).status_code == 200:
                    break
            await asyncio.sleep(0.1)
    # Warm-up (accounted like any batch): one record per node registers every node before the
    # first tick, so no record can reach a tick that does not know its node yet.
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
    setup_s = time.monotonic() - t_setup

    plan = []
    left, i = args.records, 0
    while left > 0:
        size = min(args.batch, left)
        plan.append((groups[i % len(groups)], i % len(groups), size))
        left -= size
        i += 1
    nominal_s = args.records / args.rate
    stop = threading.Event()
    t0 = time.monotonic()
    t0_wall = time.time()
    # Senders give up (batch unresolved) early enough to leave time for the drain and the report.
    give_up_at = deadline - 90
    abort = threading.Event()
    monitor = Monitor(cluster, groups, stop)
    storage = Faults("storage", cluster, args, groups, t0, abort)
    workers = Faults("workers", cluster, args, groups, t0, abort)
    web = Faults("web", cluster, args, groups, t0, abort)
    pauses = Faults("pause", cluster, args, groups, t0, abort)
    for th in (monitor, storage, workers, web, pauses):
        th.start()
    progress: dict[str, float] = {}
    try:
        await gateways(batches, plan, tag, args, url, token, stats, give_up_at, rng, progress)
    finally:
        sending_s = time.monotonic() - t0
        # Faults belong to the sending phase; one under way completes (nothing is left down).
        for th in (storage, workers, web, pauses):
            th.no_more.set()
        storage.join(timeout=max(1.0, deadline - time.monotonic() - 60))
        if storage.is_alive():
            abort.set()
            storage.join(timeout=60)
        workers.join(timeout=30)
        web.join(timeout=5)
        pauses.join(timeout=args.worker_pause_s + 10)

    # Drain: every entry delivered, acknowledged and applied (state last_id at the stream's last id).
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
            elif time.monotonic() - last_change > args.drain_stall_s:
                break
        except Exception as exc:  # Redis restarting after the last fault: keep waiting
            state = {"error": {"detail": str(exc)}}
        await asyncio.sleep(0.5)
    drain_s = time.monotonic() - t_drain
    await asyncio.sleep(1.5)  # one more beat: a last tick publishes, the monitor sees it
    stop.set()
    monitor.join(timeout=5)

    applied, per_node_applied = applied_by_detector(r, groups)
    return _report(args, cluster, groups, tag, batches, stats, applied, per_node_applied, state, monitor,
                   storage.events + workers.events + web.events + pauses.events,
                   [e for e in (storage.error, workers.error, web.error, pauses.error) if e],
                   r, setup_s=setup_s, sending_s=sending_s, drain_s=drain_s, nominal_s=nominal_s,
                   t0_wall=t0_wall, generated_s=progress.get("generated_s"))


def _report(args: argparse.Namespace, cluster: Cluster, groups: list[str], tag: str, batches: list[Batch],
            stats: HttpStats, applied: dict[str, int], per_node_applied: dict[str, int],
            state: dict[str, dict[str, Any]], monitor: Monitor, faults: list[dict[str, Any]],
            fault_errors: list[str], r: Any, **times: Any) -> dict[str, Any]:
    resolved = [b for b in batches if b.final_status == 200]
    unresolved = [b for b in batches if b.final_status is None]
    refused = [b for b in batches if b.final_status is not None and b.final_status != 200]
    landed_by_group: Counter[str] = Counter()
    http_accepted_by_group: Counter[str] = Counter()
    landed_by_node: Counter[str] = Counter()
    exact_nodes = True
    for b in resolved:
        landed_by_group[b.group] += b.accepted + b.duplicates
        http_accepted_by_group[b.group] += b.accepted
        if b.accepted + b.duplicates == b.n:
            landed_by_node.update(b.node_counts)
        else:
            exact_nodes = False  # rejected records: which node's is not in the answer
    by_group = {}
    for g in groups:
        landed, done = landed_by_group[g], applied.get(g, 0)
        by_group[g] = {"landed": landed, "http_accepted": http_accepted_by_group[g], "applied": done,
                       "lost": max(0, landed - done), "applied_twice": max(0, done - landed)}
    landed = sum(landed_by_group.values())
    applied_total = sum(applied.values())
    lost = sum(v["lost"] for v in by_group.values())
    twice = sum(v["applied_twice"] for v in by_group.values())

    # Which ids are in the dedup sets (= in the stream, exactly once) vs. which got a 200.
    expected: dict[str, set[str]] = {g: set() for g in groups}
    maybe: dict[str, set[str]] = {g: set() for g in groups}
    for b in resolved:
        expected[b.group].update(batch_ids(tag, b))
    for b in unresolved:
        maybe[b.group].update(batch_ids(tag, b))
    dedup = {"ids_in_dedup_sets": 0, "acknowledged_ids_missing": 0, "unacknowledged_ids_present": 0,
             "ids_of_unresolved_batches_present": 0, "examples_missing": []}
    for g in groups:
        ids = dedup_ids(r, g)
        dedup["ids_in_dedup_sets"] += len(ids)
        missing = expected[g] - ids
        extra = ids - expected[g]
        dedup["acknowledged_ids_missing"] += len(missing)
        dedup["ids_of_unresolved_batches_present"] += len(extra & maybe[g])
        dedup["unacknowledged_ids_present"] += len(extra - maybe[g])
        dedup["examples_missing"] += sorted(missing)[:5]

    node_mismatch = {n: [landed_by_node.get(n, 0), per_node_applied.get(n, 0)]
                     for n in set(landed_by_node) | set(per_node_applied)
                     if landed_by_node.get(n, 0) != per_node_applied.get(n, 0)}
    reset_possible = any(s not in ("healthy", "degraded") for s in monitor.states)

    dup_batches = [b for b in resolved if b.duplicates]
    conn_kinds = ("conn:",)
    dup_after_conn = [b for b in dup_batches if any(a.startswith(conn_kinds) for a in b.attempts)]
    dup_after_5xx_only = [b for b in dup_batches if b.attempts and b not in dup_after_conn]
    # Duplicates in the answer to a body's first POST: the server re-ran its own MULTI/EXEC after
    # losing the reply of one that had been applied (redis-py retries a watched transaction).
    dup_first = [b for b in dup_batches if not b.attempts]
    retried = [b for b in batches if b.attempts]
    five = sum(v for k, v in stats.status.items() if k[:1] == "5")

    weights = {}
    for g in groups:
        docs = monitor.docs[g]
        gaps = [(docs[i][2] - docs[i - 1][2], docs[i][2]) for i in range(1, len(docs))]
        gap, gap_at = max(gaps) if gaps else (None, None)
        stale = docs[-1][3] if docs else None
        weights[g] = {
            "documents_seen": len(docs),
            "longest_gap_s": round(gap, 2) if gap is not None else None,
            "longest_gap_ended_at_s": round(gap_at - times["t0_wall"], 1) if gap_at else None,
            "max_age_seen_by_poller_s": round(monitor.max_age[g][0], 2),
            "stale_after_s": stale,
            "stayed_under_stale_after_s": gap is not None and stale is not None and gap < stale,
        }
    _fault_windows(faults, stats.failures, times["t0_wall"])
    procs = {name: {"starts": p.starts, "killed_by_probe": p.killed_by_probe,
                    "unexpected_exits": p.unexpected_exits} for name, p in cluster.procs.items()}
    stream_left = {g: {k: v for k, v in s.items() if k != "done"} for g, s in state.items()}
    drained_ok = bool(state) and all(s.get("done") for s in state.values())
    problems = [name for name, bad in [
        ("records lost", lost), ("records applied twice", twice), ("unresolved batches", unresolved),
        ("streams not drained", not drained_ok), ("acknowledged ids missing from the dedup sets",
                                                  dedup["acknowledged_ids_missing"]),
        ("unacknowledged ids in the dedup sets", dedup["unacknowledged_ids_present"]),
        ("rejected records", any(b.rejected for b in resolved)), ("batches refused with a 4xx", refused),
        ("a fault could not be injected", fault_errors),
    ] if bad]
    sent = sum(b.n for b in batches)
    return {
        "verdict": "FAIL" if problems else "PASS",
        "problems": problems,
        "records_lost": lost,
        "records_applied_twice": twice,
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "keep_logs")},
        "setup_s": round(times["setup_s"], 1),
        "nominal_sending_s": round(times["nominal_s"], 1),
        "generation_s": round(times["generated_s"], 1) if times["generated_s"] else None,
        "sending_s": round(times["sending_s"], 1),
        "drain_s": round(times["drain_s"], 1),
        "records": {
            "sent": sent,
            "batches": len(batches),
            "http_accepted": sum(b.accepted for b in resolved),
            "http_duplicates_after_lost_answers": sum(b.duplicates for b in resolved),
            "landed": landed,
            "rejected": sum(b.rejected for b in resolved),
            "rejected_examples": [e for b in resolved for e in b.errors][:5],
            "refused_batches_4xx": len(refused),
            "unresolved_batches": len(unresolved),
            "unresolved_records": sum(b.n for b in unresolved),
            "applied_by_detectors": applied_total,
            "delivered_per_s": round(landed / times["sending_s"]) if times["sending_s"] else None,
        },
        "by_group": by_group,
        "dedup_set_check": dedup,
        "per_node_check": {
            "nodes": len(landed_by_node),
            "mismatching_nodes": len(node_mismatch),
            "examples_landed_vs_applied": dict(sorted(node_mismatch.items())[:5]),
            "exact": exact_nodes and not reset_possible,
            "note": "decode-EMA counts; reset when a node recovers from quarantine",
        },
        "http": {
            "posts": stats.posts,
            "answers": dict(stats.status.most_common()),
            "answers_5xx": five,
            "answers_503": stats.status.get("503", 0),
            "connection_errors": sum(v for k, v in stats.status.items() if k.startswith("conn:")),
            "retries": sum(len(b.attempts) for b in batches),
            "batches_retried": len(retried),
            "max_attempts_of_a_batch": max((len(b.attempts) + 1 for b in batches), default=0),
            "batches_with_duplicates": len(dup_batches),
            "duplicates_after_a_connection_error": sum(b.duplicates for b in dup_after_conn),
            # A 5xx says "nothing was accepted": duplicates after 5xx answers alone contradict it.
            "duplicates_after_5xx_only": sum(b.duplicates for b in dup_after_5xx_only),
            "duplicates_in_a_first_answer": sum(b.duplicates for b in dup_first),
            # [answer, s after the start of the sending the attempt was sent] of each failed attempt
            "examples_dup_after_5xx_only": [
                {"batch": b.no, "group": b.group, "duplicates": b.duplicates,
                 "failed_attempts": [[a, round(t - times["t0_wall"], 2)] for a, t in zip(b.attempts, b.attempt_times,
                                                                                         strict=True)]}
                for b in dup_after_5xx_only[:3]],
            "post_ms_p50": _pct(stats.post_ms, 50),
            "post_ms_p99": _pct(stats.post_ms, 99),
            "post_ms_max": round(max(stats.post_ms), 1) if stats.post_ms else None,
        },
        "faults": faults,
        "fault_errors": fault_errors,
        "weights": weights,
        "node_states_seen": dict(monitor.states),
        "streams_at_end": stream_left,
        "processes": procs,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _summary(f: dict[str, Any]) -> str:
    """The figures that matter, in a few lines (after the JSON)."""
    if "records" not in f:
        return f"verdict {f.get('verdict')}: {f.get('error', '')[-500:]}"
    rec, http = f["records"], f["http"]
    lines = [
        f"verdict {f['verdict']} {f['problems'] or ''}",
        f"records: sent {rec['sent']}, http accepted {rec['http_accepted']} + duplicates "
        f"{rec['http_duplicates_after_lost_answers']} = landed {rec['landed']}, applied {rec['applied_by_detectors']}; "
        f"lost {f['records_lost']}, applied twice {f['records_applied_twice']}, unresolved {rec['unresolved_records']}",
        f"http: {http['posts']} POSTs, {http['answers_5xx']} 5xx ({http['answers_503']} 503), "
        f"{http['connection_errors']} connection errors, {http['retries']} retries",
    ]
    for ev in f["faults"]:
        lasted = ev.get("lasted_s", ev.get("paused_s", ev.get("restarted_after_s")))
        extra = ev.get("died_holding_lock_of") or ev.get("tick_locks_held_at_kill") or ""
        lines.append(f"fault {ev['fault']} at {ev.get('at_s')} s, lasted {lasted} s {extra}")
    for g, w in f["weights"].items():
        lines.append(f"weights {g}: longest gap {w['longest_gap_s']} s (stale_after_s {w['stale_after_s']}, "
                     f"under: {w['stayed_under_stale_after_s']})")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
