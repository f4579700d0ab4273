"""The chaos probe's private cluster: its own PostgreSQL, Redis (single, or a primary, a replica and three
Sentinels), gunicorn, Celery workers and beat, all on 127.0.0.1, started and stopped by :class:`Cluster`;
process helpers (CPU seconds, children, threads). See ``bench/chaos_probe.py`` for what a run does."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

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


def _redis_client(port: int) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # The probe's own reads must fail fast during a Redis outage (no redis-py retries).
    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))


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
        from contract.topology import sentinel_problem

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
