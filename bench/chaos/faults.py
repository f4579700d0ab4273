"""The chaos probe's fault schedule (:class:`Faults`: Redis kill -9 or failover, PostgreSQL stop, Celery and
gunicorn worker kill -9, worker SIGSTOP) and the :class:`Monitor` that samples the cluster meanwhile."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

from bench.chaos.cluster import (
    SENTINEL_MASTER,
    Cluster,
    _children,
    _cpu_seconds,
    _dir_size,
    _redis_client,
    _threads,
)
from bench.chaos.readback import applied_by_detector
from contract import keys
from contract.weights_document import DocumentError, WeightsDocument

# ------------------------------------------------------------------------------- monitor & faults


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
                    doc = WeightsDocument.from_json(raw, expected_group=g)  # as a gateway reads it
                    key = (doc.version, doc.generated_at)
                    if key != last[g]:
                        last[g] = key
                        self.states.update(n.state for n in doc.nodes)
                        self.docs[g].append((now, doc.version, doc.generated_at, doc.stale_after_s))
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
                with contextlib.suppress(redis.RedisError, DocumentError):
                    version = WeightsDocument.from_json(r.get(keys.weights(g)), expected_group=g).version
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
