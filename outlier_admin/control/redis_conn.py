"""The one place that opens Redis connections (so the demo can swap in fakeredis): a single Redis
(``redis://``), one run with Sentinel (``redis+sentinel://``; see docs/redis-ha.md) or a Redis Cluster
(``redis+cluster://``; see docs/scale.md), and the locks and fences of the tick over them.

Every key and channel is named in :mod:`contract.keys`. On a Redis Cluster every transaction here
(a lock's release and extension, the tick's fence) touches the keys of one group only, which share one
hash slot (``outlier:{<group>}:...``): a cluster refuses a MULTI/EXEC or a WATCH across slots.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings

from contract import keys
from contract.topology import is_cluster, redis_from_url  # Django-free: the agents use it too

log = logging.getLogger(__name__)
_local = threading.local()
_override: Any = None


#: A Redis that cannot take a command now but will: unreachable, timing out, or a Redis Cluster slot being
#: moved (``TRYAGAIN``, an ``ASK``/``MOVED`` redis-py gave up following) or failed over. Nothing of a
#: transaction that raised one was applied: the ingest answers 503 (retry the body), a tick is retried.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.TryAgainError, redis.exceptions.AskError,
    redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError)


def client_for(url: str) -> redis.Redis:
    """A client for ``url`` with the control plane's socket timeouts: a plain ``redis://`` URL, a
    ``redis+sentinel://host:port,.../<master>/<db>`` one or a ``redis+cluster://host:port,...`` one
    (the one URL-to-client function, :func:`contract.topology.redis_from_url`, which the
    agents use too). Tools and benchmarks that take a URL build their client here, never with
    ``redis.Redis.from_url``. A cluster client's ``MOVED``/``ASK`` redirections are counted in
    ``outlier_redis_cluster_redirections_total``."""
    client = redis_from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30)
    return client


def get_redis() -> redis.Redis:
    """A client for ``settings.REDIS_URL`` (one per thread; redis-py pools connections). With a
    sentinel URL the client follows a failover by itself (see :func:`client_for`)."""
    if _override is not None:
        return _override
    url = settings.REDIS_URL
    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "url", None) != url:
        client = client_for(url)
        _local.client, _local.url = client, url
    return client


def mget(client: Any, names: list[str]) -> list[bytes | None]:
    """``MGET`` of keys that may sit in several cluster slots (one group's each): on a Redis Cluster
    redis-py's ``mget_nonatomic`` (one ``MGET`` per slot, pipelined); a single ``MGET`` otherwise."""
    if not names:
        return []
    return client.mget_nonatomic(names) if is_cluster(client) else client.mget(names)


# --- replica acknowledgement ------------------------------------------------------------------------------

#: Written just before every ``WAIT`` (see :func:`replicas_acked`); holds nothing anyone reads.
REPLICA_ACK_KEY = keys.REPLICA_ACK


class NotReplicated(redis.RedisError):
    """Fewer replicas than ``REDIS_MIN_REPLICAS_ACK`` acknowledged a write within
    ``REDIS_REPLICA_ACK_TIMEOUT_MS``: the write is on the primary but could be lost with it."""

    def __init__(self, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(f"{acked} of {wanted} replica(s) acknowledged the write within {timeout_ms} ms")
        self.acked, self.wanted, self.timeout_ms = acked, wanted, timeout_ms


def replicas_acked(client: redis.Redis, wanted: int, timeout_ms: int) -> int:
    """How many replicas hold every write the primary took so far (at most ``timeout_ms`` of waiting
    for ``wanted`` of them): Redis ``WAIT``, one round trip.

    ``WAIT`` waits for the writes of *its own connection*, and the write to wait for may have gone
    out on another connection of the pool (a pipeline, a transaction). So the same round trip first
    writes :data:`REPLICA_ACK_KEY` on the connection that sends the ``WAIT``: replication is one
    ordered stream, and a replica that acknowledged that write holds every earlier one, whichever
    connection sent it."""
    pipe = client.pipeline(transaction=False)
    pipe.set(REPLICA_ACK_KEY, b"1", px=60_000)
    pipe.execute_command("WAIT", int(wanted), int(timeout_ms))
    return int(pipe.execute()[1])


def require_replicas(client: redis.Redis | None = None) -> int:
    """Make what the primary took so far survive the loss of the primary before it counts as done:
    wait for ``REDIS_MIN_REPLICAS_ACK`` replicas (``WAIT``, at most ``REDIS_REPLICA_ACK_TIMEOUT_MS``)
    and raise :class:`NotReplicated` when fewer acknowledge. Returns how many did; ``0`` and no
    round trip when the setting is 0 (a single Redis, or replication left asynchronous).

    Why: Redis replicates asynchronously, so a write the primary acknowledged can be missing on the
    replica that Sentinel promotes when the primary dies. The ingest answers 200 only after this
    (a 503 otherwise: the client retries the body, its ``request_id`` s make the retry safe), and a
    tick writes SQL and acknowledges its stream entries only after it (:mod:`.tick`)."""
    wanted = settings.REDIS_MIN_REPLICAS_ACK
    if wanted <= 0:
        return 0
    timeout_ms = settings.REDIS_REPLICA_ACK_TIMEOUT_MS
    acked = replicas_acked(client if client is not None else get_redis(), wanted, timeout_ms)
    if acked < wanted:
        raise NotReplicated(acked, wanted, timeout_ms)
    return acked


def set_redis(client: Any) -> None:
    """Use ``client`` (e.g. ``fakeredis.FakeRedis()``) for every caller; ``None`` restores REDIS_URL."""
    global _override
    _override = client


def mark_inputs_pending(group: str) -> None:
    """Tell ``group``'s tick that an operator input waits in SQL (call after the row is committed:
    ``transaction.on_commit``). A tick queries the inputs only when this counter is set (or some node
    waits for approval, or on a new history slot, which bounds the delay if this mark was lost)."""
    try:
        get_redis().incr(keys.inputs(group))
    except redis.RedisError as exc:  # the row is committed; the next history slot's tick applies it
        log.warning("operator input of %s not signalled to its tick: %s", group, exc)


class GroupLock:
    """A per-group lease: ``SET key token NX PX ttl``; extended and released only by its holder.

    Release and extension use WATCH/MULTI (no Lua: fakeredis without ``lupa`` cannot run scripts).
    With ``max_hold_ms``, :meth:`acquire` starts a thread that extends the lease every ``ttl/3``
    while the holder works, so a slow tick keeps its lock while a dead worker's lapses within one
    ``ttl`` (the thread dies with the process). Extension stops ``max_hold_ms`` after acquisition:
    a holder that hangs (alive, renewing, making no progress) must not keep its group unticked
    until the gateways' documents go stale. A holder that outlives its lease loses the lock; stream
    entries are therefore applied idempotently (``last_id``).
    """

    def __init__(self, client: redis.Redis, key: str, ttl_ms: int, *, max_hold_ms: int | None = None) -> None:
        import secrets

        self.client, self.key, self.ttl_ms, self.max_hold_ms = client, key, ttl_ms, max_hold_ms
        self.token = secrets.token_hex(8)
        self.held = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> bool:
        self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        if self.held and self.max_hold_ms:
            self._stop.clear()
            deadline = time.monotonic() + self.max_hold_ms / 1000.0
            self._renewer = threading.Thread(target=self._renew, args=(deadline,), daemon=True,
                                             name=f"lease:{self.key}")
            self._renewer.start()
        return self.held

    def is_current(self, value: bytes | None) -> bool:
        """Whether the lock key's ``value`` is this holder's token."""
        return self.held and value is not None and value.decode() == self.token

    def extend(self, ttl_ms: int | None = None) -> bool:
        """Reset the lease to ``ttl_ms`` (default: the lock's ttl) if we still hold it."""
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                current = pipe.get(self.key)
                if current is None or current.decode() != self.token:
                    pipe.unwatch()
                    return False
                pipe.multi()
                pipe.pexpire(self.key, int(ttl_ms or self.ttl_ms))
                pipe.execute()
                return True
            except redis.WatchError:
                return False  # changed under us: someone else holds it now

    def _renew(self, deadline: float) -> None:
        # Every third of a lease: one renewal can be missed (a stalled thread, a Redis hiccup) with a third to spare.
        period = self.ttl_ms / 3000.0
        while not self._stop.wait(period):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                log.warning("%s held for %d ms: no longer extended", self.key, self.max_hold_ms)
                return
            try:
                if not self.extend(min(self.ttl_ms, left_ms)):
                    log.warning("%s: lease lost while held", self.key)
                    return
            except redis.RedisError as exc:
                log.warning("%s: lease not extended: %s", self.key, exc)

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None

    def release(self) -> None:
        self._stop_renewing()
        if not self.held:
            return
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                current = pipe.get(self.key)
                if current is not None and current.decode() == self.token:
                    pipe.multi()
                    pipe.delete(self.key)
                    pipe.execute()
                else:
                    pipe.unwatch()
            except redis.WatchError:
                pass  # changed under us: someone else holds it now
        self.held = False

    def __enter__(self) -> GroupLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LeaseLost(RuntimeError):
    """A tick's lock passed to another worker while it ran: its writes are dropped (see :func:`fenced`)."""


def fenced(client: redis.Redis, lock: GroupLock | None, state: str, expected_rev: bytes | None,
           queue: Callable[[Any], None]) -> None:
    """Run the commands ``queue`` adds to a pipeline in one MULTI/EXEC, only while ``lock`` is still
    held by its holder and the detector state's ``rev`` (the token every tick's write sets) is still
    ``expected_rev`` (both WATCHed up to the EXEC); raises :class:`LeaseLost` otherwise.

    Why: a tick that stalls past its lease (a VM or GC pause, a hung database call) while another
    worker takes the group over, applies the same entries and newer ones, stores its state and
    acknowledges them, must not resume and store its older state over its successor's: that
    un-applies the successor's entries, which are gone from the stream (measured by the chaos probe:
    250 of 30,000 records lost at one 7 s pause, 16,000 of 40,016 at four)."""
    watched = [state] + ([lock.key] if lock is not None else [])
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(*watched)
            if lock is not None and not lock.is_current(pipe.get(lock.key)):
                raise LeaseLost(f"{lock.key}: held by another tick now")
            if pipe.hget(state, "rev") != expected_rev:
                raise LeaseLost(f"{state}: advanced by another tick")
            pipe.multi()
            queue(pipe)
            pipe.execute()
        except redis.WatchError:
            raise LeaseLost(f"{state}: changed by another tick while this one wrote") from None


class Fence:
    """:func:`fenced`, opened before the tick reads what it will check: the lock and the state are
    WATCHed first (one round trip), the tick reads the lock's value and the state's ``rev`` in its own
    read pipeline, and :meth:`commit` sends the MULTI/EXEC (one more) — two round trips instead of
    :func:`fenced`'s four. Anything that touches either key in between (another tick, or this tick's
    own lease renewal, which comes only after a third of a lease) aborts the EXEC; :meth:`commit`
    then falls back to :func:`fenced`, which tells the two apart (:class:`LeaseLost` for the first).
    Always :meth:`close` it (it holds a connection while open)."""

    def __init__(self, client: redis.Redis, lock: GroupLock | None, state: str) -> None:
        self.client, self.lock, self.state = client, lock, state
        self._pipe = client.pipeline(transaction=True)
        self._pipe.watch(state, *([lock.key] if lock is not None else []))

    def commit(self, lock_value: bytes | None, expected_rev: bytes | None, queue: Callable[[Any], None]) -> None:
        """Run what ``queue`` adds in one MULTI/EXEC if the lock's value read after the WATCH
        (``lock_value``) is this holder's and nothing changed since; ``expected_rev`` is the state's
        ``rev`` read after the WATCH. Raises :class:`LeaseLost` when another tick has the group."""
        if self.lock is not None and not self.lock.is_current(lock_value):
            self.close()
            raise LeaseLost(f"{self.lock.key}: held by another tick now")
        try:
            self._pipe.multi()
            queue(self._pipe)
            self._pipe.execute()
        except redis.WatchError:
            self.close()
            fenced(self.client, self.lock, self.state, expected_rev, queue)
        finally:
            self.close()

    def close(self) -> None:
        self._pipe.reset()  # UNWATCH (if still watching) and give the connection back


def tick_lock(client: redis.Redis, group: str) -> GroupLock:
    """The lease of ``group``'s tick: ``TICK_LOCK_TTL_MS``, renewed while the tick runs, for at most
    half of ``WEIGHTS_STALE_AFTER_S`` (past that, a hung holder's group must go to another worker
    while the gateways still trust its last document; see :mod:`outlier_admin.control.checks`)."""
    return GroupLock(client, keys.tick_lock(group), settings.TICK_LOCK_TTL_MS,
                     max_hold_ms=settings.WEIGHTS_STALE_AFTER_S * 500)
