"""A Redis Cluster of three primaries on loopback, as ``redis-cli --cluster create`` builds it: each node a
``redis-server --cluster-enabled yes`` of its own, in its own directory, on a free port of 127.0.0.1
(from 17300; the cluster bus is port + 10000). Used by the cluster tests and ``bench/cluster_scale.py``;
the machine's shared Redis is never touched. :meth:`RedisClusterProcs.move_slot` moves one hash slot to
another primary the way ``redis-cli --cluster reshard`` does (``CLUSTER SETSLOT IMPORTING/MIGRATING``,
``MIGRATE`` key by key, ``SETSLOT NODE``), so a test can reshard a group's slot mid-load."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
SLOTS = 16384


def available() -> bool:
    return REDIS_SERVER is not None and REDIS_CLI is not None


def free_port(start: int, taken: set[int]) -> int:
    """A loopback port at or above ``start`` free for a node and for its cluster bus (port + 10000)."""
    for port in range(start, start + 500):
        if port in taken:
            continue
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port pair in {start}-{start + 499}")


def slot_of(key: str) -> int:
    """The cluster hash slot of ``key`` (CRC16/XMODEM of its hash tag, mod 16384), as Redis computes it."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    crc = 0
    for byte in key.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % SLOTS


class RedisClusterProcs:
    """Three (or ``primaries``) cluster nodes: :meth:`start`, :meth:`url`, :meth:`node`, :meth:`move_slot`,
    :meth:`stop`. ``maxmemory`` and persistence are off: the nodes are scratch space."""

    def __init__(self, workdir: Path, primaries: int = 3, *, first_port: int = 17300) -> None:
        self.dir = workdir
        self.primaries = primaries
        self._taken: set[int] = set()
        self.ports = [free_port(first_port, self._taken) for _ in range(primaries)]
        self.procs: dict[int, subprocess.Popen] = {}

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def _start_node(self, port: int) -> None:
        d = self.dir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        cmd = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
               "--cluster-config-file", str(d / "nodes.conf"), "--cluster-node-timeout", "2000",
               "--dir", str(d), "--save", "", "--appendonly", "no", "--protected-mode", "no",
               "--logfile", str(d / "redis.log")]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self, timeout_s: float = 20) -> None:
        for port in self.ports:
            self._start_node(port)
        wait_until(lambda: all(self.node(p).ping() for p in self.ports), timeout_s, "cluster nodes answering")
        out = subprocess.run([REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                              "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
                             timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        wait_until(lambda: all(_info(self.node(p)).get("cluster_state") == "ok" for p in self.ports), timeout_s,
              "cluster_state ok on every node")

    def node_ids(self) -> dict[int, str]:
        """port -> node id."""
        return {p: self.node(p).execute_command("CLUSTER", "MYID").decode() for p in self.ports}

    def owner_of_slot(self, slot: int) -> int:
        """The port of the primary serving ``slot`` (as the first node sees the map)."""
        for start, end, primary, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise RuntimeError(f"slot {slot} is served by no node")

    def move_slot(self, slot: int, to_port: int, *, batch: int = 10, pause_s: float = 0.0) -> int:
        """Move ``slot`` to the primary on ``to_port`` while clients keep using it: mark it IMPORTING on the
        target and MIGRATING on the source, ``MIGRATE`` its keys ``batch`` at a time (``pause_s`` between
        batches stretches the window in which clients get ``ASK``), then assign it to the target on every
        node. Returns how many keys moved."""
        src = self.owner_of_slot(slot)
        if src == to_port:
            return 0
        ids = self.node_ids()
        source, target = self.node(src), self.node(to_port)
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
        moved = 0
        while True:
            names = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not names:
                break
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *names)
            moved += len(names)
            if pause_s:
                time.sleep(pause_s)
        for port in (to_port, src, *[p for p in self.ports if p not in (src, to_port)]):
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[to_port])
        return moved

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()


def _info(client: redis.Redis) -> dict[str, str]:
    text = client.execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def wait_until(predicate, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms (a Redis or socket error counts as not yet) until it holds;
    ``RuntimeError("<what> within <timeout_s> s")`` when it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} within {timeout_s} s")
