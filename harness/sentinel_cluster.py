"""A replicated Redis on loopback, as an SRE runs it: one primary, replicas (``redis-server --replicaof``)
and three Redis Sentinels (``redis-server sentinel.conf --sentinel``) with a low
``down-after-milliseconds`` / ``failover-timeout`` so a failover takes a couple of seconds. Every process
is this test's own, on free ports of 127.0.0.1 (data nodes from 16300, Sentinels from 26300), stopped
at the end; the machine's shared Redis is never touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from harness.redis_cluster import wait_until

MASTER = "oa-test"
DOWN_AFTER_MS = 500  # a dead primary is subjectively down after this
FAILOVER_TIMEOUT_MS = 2000  # a failed election is retried after this


def _free_port(start: int, taken: set[int]) -> int:
    """A free loopback port at or above ``start`` (the ranges this suite's Sentinel tests use)."""
    for port in range(start, start + 100):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {start}-{start + 99}")


class SentinelCluster:
    """Processes by port; :meth:`kill_primary` is ``kill -9``, :meth:`start_node` brings a node (back)."""

    def __init__(self, workdir: Path, replicas: int = 1) -> None:
        self.dir = workdir
        self._taken: set[int] = set()
        self.nodes: dict[int, subprocess.Popen] = {}
        self.sentinels: dict[int, subprocess.Popen] = {}
        self.primary_port = _free_port(16300, self._taken)
        self.replica_ports = [_free_port(16300, self._taken) for _ in range(replicas)]
        self.sentinel_ports = [_free_port(26300, self._taken) for _ in range(3)]

    # --- URLs ---------------------------------------------------------------------------------------
    def url(self, db: int = 0, master: str = MASTER) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{master}/{db}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1)

    def sentinel(self, i: int = 0) -> redis.Redis:
        return self.node(self.sentinel_ports[i])

    # --- processes ----------------------------------------------------------------------------------
    def start_node(self, port: int, replica_of: int | None = None) -> None:
        data = self.dir / f"node-{port}"
        data.mkdir(exist_ok=True)
        # No persistence: a killed node comes back empty, the worst case for what it held.
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(data), "--repl-timeout", "5",
                # A replica's first sync at once (the default waits 5 s for more replicas to share it).
                "--repl-diskless-sync-delay", "0"]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.nodes[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.node(port).ping(), 5, f"redis-server :{port} did not answer")

    def wait_replicas(self, primary: int, n: int, timeout_s: float = 10) -> None:
        """Until ``primary`` has ``n`` replicas in sync (``online``: past the first full sync)."""
        def synced() -> bool:
            info = self.node(primary).info("replication")
            return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                       and v.get("state") == "online") >= n
        wait_until(synced, timeout_s, f"{n} replica(s) of :{primary} not in sync")

    def _start_sentinel(self, port: int) -> None:
        conf = self.dir / f"sentinel-{port}.conf"  # Sentinel rewrites its own file: one each
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        self.sentinels[port] = subprocess.Popen(["redis-server", str(conf), "--sentinel"],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self, sentinels: bool = True) -> None:
        self.start_node(self.primary_port)
        for port in self.replica_ports:
            self.start_node(port, replica_of=self.primary_port)
        self.wait_replicas(self.primary_port, len(self.replica_ports))
        if not sentinels:
            return
        for port in self.sentinel_ports:
            self._start_sentinel(port)

        def ready() -> bool:
            for i in range(3):
                m = self.sentinel(i).sentinel_masters()[MASTER]
                if int(m["num-other-sentinels"]) != 2 or int(m["num-slaves"]) != len(self.replica_ports):
                    return False
            return True

        # Every Sentinel must know the others (an election needs a quorum) and the replicas.
        wait_until(ready, 20, "the Sentinels did not discover each other and the replicas")

    def kill_primary(self) -> int:
        """``kill -9`` the current primary; returns its port."""
        port = self.current_primary()
        proc = self.nodes.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
        return port

    def named_primary(self, i: int) -> int:
        """The primary's port as Sentinel ``i`` names it (the raw command: redis-py's helper for it
        takes options a plain client passes along and fails)."""
        return int(self.sentinel(i).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)[1])

    def current_primary(self) -> int:
        """The port the Sentinels name as the primary now."""
        return self.named_primary(0)

    def wait_failover(self, old: int, timeout_s: float = 15) -> int:
        """Wait until every Sentinel names a new primary that answers as one; returns its port."""
        def done() -> bool:
            ports = {self.named_primary(i) for i in range(3)}
            return len(ports) == 1 and old not in ports and \
                self.node(next(iter(ports))).info("replication")["role"] == "master"
        wait_until(done, timeout_s, "no failover")
        return self.current_primary()

    def pause(self, port: int) -> None:
        """SIGSTOP a node: it stays connected and acknowledges nothing (a replica that lags)."""
        os.kill(self.nodes[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        os.kill(self.nodes[port].pid, signal.SIGCONT)

    def stop(self) -> None:
        for proc in [*self.sentinels.values(), *self.nodes.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=5)
        self.sentinels.clear()
        self.nodes.clear()


@pytest.fixture
def sentinel_cluster(tmp_path) -> Iterator[SentinelCluster]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not installed")
    cluster = SentinelCluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
