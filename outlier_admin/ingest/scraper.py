"""Model-server ``/metrics`` at fleet scale: one asyncio loop per process, sharded by group.

What an SRE runs: ``manage.py scrape_metrics --shard I/N`` for I in 0..N-1 (the ``scraper`` service
of docker-compose; a scrape of a 40 KB vLLM page costs about 0.5 ms of CPU, so a process given a
whole core holds about 500 nodes at 4 Hz: ``python -m bench.scraper``). A shard is the groups with ``crc32(name) % N == I``: all the
nodes of a group in one process, so a group's rows reach its stream from one writer.

Inside a process every node has its own coroutine: GET ``metrics_url``, parse, sleep to the node's
next slot (``METRICS_SCRAPE_INTERVAL_MS``, 250 ms; each node at its own phase, spread over the
period, so the requests do not come in bursts). One aiohttp session holds a bounded pool of
keep-alive connections (``METRICS_MAX_CONNECTIONS``) and each request has its own timeout
(``METRICS_TIMEOUT_MS``, from the request to the last byte), so a slow or dead node delays only its
own next scrape (a slot it missed is skipped, never made up in a burst). No Celery task per node:
at 2,000 scrapes a second a task's own cost would be the whole budget.

Scrapes are kept by a single writer coroutine: whatever finished within :data:`WRITE_EVERY_S`
(20 ms) of the first, or while the previous write was in flight, goes in one write
(:func:`outlier_admin.ingest.modelserver.write_scrapes`, one MULTI/EXEC, run in a thread so the loop
keeps scraping). The previous counters of a node are kept in memory and seeded from Redis when a
node is first seen (or the shard taken over), so a restarted or replacing process continues the
same series.

**llama.cpp.** Its ``/metrics`` page has no live decode series (:mod:`detector.engine_metrics`,
"Engines"): when a node's page is llama.cpp's, the same coroutine also GETs ``/slots`` (:func:`slots_url`:
the scheme, host and port of the operator's ``metrics_url``, never an address from a page), with the
same timeout and size cap, and keeps the snapshot with the node's counters. A 404 or 501 there
(``--no-slots``) means slots are off: the node's rows come from the finished-request counters (late)
and ``/slots`` is tried again after :data:`SLOTS_RETRY_S`. A ``/slots`` that fails otherwise (or is
refused: not a slot list, too many slots, a count out of bounds) is a failure of its kind with the
detail ``slots: ...``; the counters of that scrape are kept, and no decode is counted across it.

Failures are counted by kind and node, ``outlier_scrape_failures_total{group,node,kind}``
(:data:`KINDS`), and kept as rejected input (``RejectedInput``, reason ``scrape_failed``) at most once
per node, kind and :data:`REJECT_EVERY_S` (a dead node scraped at 4 Hz would otherwise write 240
rows a minute): a process-local check first, then ``SET NX EX`` in Redis across processes.

**One scraper per shard.** A process holds its shard with a Redis lease (:func:`contract.keys.scraper_lease`,
renewed every second, lost after :func:`lease_ttl_ms`); a second process started for the same shard
waits as a hot standby and takes over when the first dies. While any lease is held
(:data:`contract.keys.SCRAPER_ALIVE`), the Celery beat entry ``ingest.scrape_all_metrics`` (one round over every
node, :func:`scrape_round`: the demo and ``celery worker --beat`` alone) steps aside, so a node is never
scraped by two writers whose rows would count its tokens twice. Run every process with the same N.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import redis
import yarl
from django.conf import settings

from contract import keys
from detector.engine_metrics import EngineCounters, advance
from detector.engines.llamacpp import SlotsError, slots_from_json
from outlier_admin.control.redis_conn import get_redis
from outlier_admin.ingest.modelserver import (
    Scrape,
    UnrecognisedEngine,
    decode_prev,
    read_counters,
    write_scrapes,
)

log = logging.getLogger(__name__)

#: Failure kinds (the ``kind`` label): no answer in time, no connection (refused, reset, closed),
#: a status other than 200 (redirects are not followed), a body over ``METRICS_MAX_BYTES``, broken
#: HTTP, a page we cannot read (a value not a number, not UTF-8, a refused llama.cpp ``/slots``), a
#: page no engine we know wrote (:class:`~outlier_admin.ingest.modelserver.UnrecognisedEngine`).
KINDS = ("timeout", "connect", "http_status", "too_large", "protocol", "parse", "unrecognised_engine")
#: How long a llama.cpp node whose ``/slots`` answered 404/501 (slots off) goes without asking again:
#: an operator turning slots on is seen within minutes, and a node with slots off costs one extra
#: request per 5 minutes, not one per scrape.
SLOTS_RETRY_S = 300.0
REJECT_EVERY_S = 60
#: The writer waits this long after the first scrape of a batch: at 4 Hz a scrape's row reaches
#: Redis at most 20 ms later, and a process writes at most 50 times a second whatever its nodes
#: (one write a scrape cost 2x the CPU a scrape at 50 nodes, measured by scraper_bench).
WRITE_EVERY_S = 0.02
MAX_SHARDS = 1024
ALIVE_KEY = keys.SCRAPER_ALIVE
_HEADERS = {"Accept": "text/plain", "Accept-Encoding": "identity"}  # no OpenMetrics, no gzip CPU
_JSON_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}


def lease_key(shard: tuple[int, int]) -> str:
    return keys.scraper_lease(shard[0], shard[1])


def lease_ttl_ms(interval_s: float) -> int:
    """A lease outlives 3 missed renewals (one a second) and never less than 4 scrape periods."""
    return int(max(3.0, 4 * interval_s) * 1000)


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N <= MAX_SHARDS``; ``ValueError`` otherwise."""
    i, sep, n = spec.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or len(i) > 4 or len(n) > 4:
        raise ValueError(f"shard {spec[:20]!r}: write I/N, e.g. 0/4")
    shard = int(i), int(n)
    if not 0 < shard[1] <= MAX_SHARDS or shard[0] >= shard[1]:
        raise ValueError(f"shard {spec}: need 0 <= I < N <= {MAX_SHARDS}")
    return shard


def shard_of(group: str, shards: int) -> int:
    """The shard of a group: ``crc32(name) % shards`` (stable across processes, unlike ``hash``)."""
    return zlib.crc32(group.encode()) % shards


@dataclass(frozen=True, slots=True)
class Target:
    """One node to scrape: its group, id (``Node.name``) and validated ``metrics_url``."""

    group: str
    node: str
    url: str


def load_targets(shard: tuple[int, int] = (0, 1)) -> list[Target]:
    """The live nodes with a ``metrics_url`` of the groups in ``shard`` (from PostgreSQL). A URL that
    no longer validates (a row older than the validation) is skipped and logged, never fetched."""
    from contract.names import NameError_, validate_scrape_url
    from outlier_admin.fleet.models import ModelGroup, Node

    groups = [gid for gid, name in ModelGroup.objects.filter(retired=False).values_list("id", "name") if shard_of(name, shard[1]) == shard[0]]
    out = []
    for group, node, url in (Node.objects.filter(retired=False, group_id__in=groups).exclude(metrics_url="")
                             .values_list("group__name", "name", "metrics_url")):
        try:
            out.append(Target(group, node, validate_scrape_url(url)))
        except NameError_ as exc:
            log.warning("metrics scrape of %s/%s skipped: %s", group, node, exc.detail)
    return out


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] or redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
    return 1
end
return 0
"""


def renew_lease(r: redis.Redis, shard: tuple[int, int], token: str, ttl_ms: int) -> bool:
    """Take or extend the shard's lease for ``token`` (and mark a service alive); ``False`` while
    another process holds it. One script, so a check and its extension cannot interleave."""
    return bool(r.eval(_RENEW, 2, lease_key(shard), ALIVE_KEY, token, ttl_ms))


def release_lease(r: redis.Redis, shard: tuple[int, int], token: str) -> None:
    """Give the lease up at a clean stop (a standby takes it at its next renewal)."""
    try:
        if r.get(lease_key(shard)) == token.encode():
            r.delete(lease_key(shard))
    except redis.RedisError:
        pass  # it lapses after its TTL


def service_alive(r: redis.Redis) -> bool:
    """Whether a ``scrape_metrics`` process holds a shard (then the beat's rounds step aside)."""
    return bool(r.exists(ALIVE_KEY))


class ScrapeError(Exception):
    """A failed scrape, with its :data:`KINDS` kind (and the HTTP status, for ``http_status``)."""

    def __init__(self, kind: str, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status = status


def slots_url(metrics_url: yarl.URL) -> yarl.URL:
    """llama.cpp's ``/slots`` beside a validated ``metrics_url``: same scheme, host and port; the
    path's last ``metrics`` segment replaced (a server behind a path prefix keeps it), else ``/slots``."""
    path = metrics_url.path
    prefix = path[: -len("metrics")] if path.endswith("/metrics") else "/"
    return metrics_url.with_path(prefix + "slots").with_query(None).with_fragment(None)


async def fetch(session: aiohttp.ClientSession, url: str | yarl.URL, *, timeout: aiohttp.ClientTimeout,
                max_bytes: int, headers: dict[str, str] = _HEADERS) -> str:
    """The body of ``GET url`` as text; :class:`ScrapeError` on any failure (never a redirect)."""
    try:
        async with session.get(url, allow_redirects=False, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise ScrapeError("http_status", f"HTTP {resp.status}", resp.status)
            if (resp.content_length or 0) > max_bytes:
                raise ScrapeError("too_large", f"Content-Length {resp.content_length} > {max_bytes} bytes")
            body = bytearray()
            async for chunk in resp.content.iter_any():
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeError("too_large", f"body over {max_bytes} bytes")
    except TimeoutError:
        raise ScrapeError("timeout", f"no answer within {timeout.total:g} s") from None
    except (aiohttp.ClientConnectionError, OSError) as exc:
        raise ScrapeError("connect", f"{type(exc).__name__}: {exc}") from None
    except aiohttp.ClientError as exc:  # a malformed status line, headers or chunked body
        raise ScrapeError("protocol", f"{type(exc).__name__}: {exc}") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError("parse", f"not UTF-8: {exc}") from None


@dataclass
class Stats:
    """What a scraper did (for the benchmark and the command's log line)."""

    scrapes: int = 0
    rows: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    parse_s: float = 0.0  # time spent in read_counters (the page -> counters step)
    by_node: dict[tuple[str, str], int] = field(default_factory=dict)  # scrapes that succeeded
    skipped: int = 0  # slots a node missed (its previous scrape still running, or the loop late)
    #: How late each slot started (s; the loop's own lag), the last 100,000.
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))


class Scraper:
    """Scrapes targets and keeps their rows (see module docstring). Use :meth:`round` for one pass
    or :meth:`run` for the long-running loop of a shard."""

    def __init__(self, r: redis.Redis | None = None, *, interval_s: float | None = None,
                 timeout_s: float | None = None, max_connections: int | None = None,
                 max_bytes: int | None = None, clock: Callable[[], float] = time.time,
                 slots_off: dict[tuple[str, str], float] | None = None) -> None:
        self.r = r if r is not None else get_redis()
        self.interval_s = interval_s or settings.METRICS_SCRAPE_INTERVAL_MS / 1000.0
        self.timeout_s = timeout_s or settings.METRICS_TIMEOUT_MS / 1000.0
        self.max_connections = max_connections or settings.METRICS_MAX_CONNECTIONS
        self.max_bytes = max_bytes or settings.METRICS_MAX_BYTES
        self._timeout = aiohttp.ClientTimeout(total=self.timeout_s)  # from the request to the last byte
        self._urls: dict[str, yarl.URL] = {}
        self.clock = clock
        self.stats = Stats()
        self.prev: dict[tuple[str, str], tuple[float, EngineCounters] | None] = {}
        self._pending: list[Scrape] = []
        self._wake = asyncio.Event()
        self._rejected_at: dict[tuple[str, str, str], float] = {}
        self._rejects: list[tuple[Target, ScrapeError]] = []
        self._write_failed_at = 0.0
        # node -> monotonic time to ask /slots again (the beat's rounds share one across their Scrapers)
        self._slots_off: dict[tuple[str, str], float] = {} if slots_off is None else slots_off
        self.active = True  # False while another process holds this shard's lease

    # -- one scrape -----------------------------------------------------------------------------
    async def scrape(self, session: aiohttp.ClientSession, t: Target) -> None:
        """Fetch, parse and queue one node's scrape for the writer; a failure is counted and kept."""
        try:
            url = self._urls.get(t.url)
            if url is None:  # parsed once, not at every request (validate_scrape_url checked it)
                url = self._urls[t.url] = yarl.URL(t.url)
            text = await fetch(session, url, timeout=self._timeout, max_bytes=self.max_bytes)
            now = self.clock()
            started = time.perf_counter()
            try:
                cur = read_counters(text)
            except UnrecognisedEngine as exc:
                raise ScrapeError("unrecognised_engine", str(exc)) from None
            except ValueError as exc:
                raise ScrapeError("parse", str(exc)) from None
            finally:
                self.stats.parse_s += time.perf_counter() - started
        except ScrapeError as exc:
            self._failed(t, exc)
            return
        if cur.engine == "llamacpp":
            cur = await self._with_slots(session, t, url, cur)
            if cur.slots is not None:
                now = self.clock()  # the decode rows are timed by the /slots snapshots
        self.stats.scrapes += 1
        key = (t.group, t.node)
        self.stats.by_node[key] = self.stats.by_node.get(key, 0) + 1
        row, cur = advance(t.node, self.prev.get(key), now, cur)  # cur: what the next row starts from
        self.prev[key] = (now, cur)
        self._pending.append((t.group, t.node, now, cur, row))
        self._wake.set()

    async def _with_slots(self, session: aiohttp.ClientSession, t: Target, url: yarl.URL,
                          cur: EngineCounters) -> EngineCounters:
        """``cur`` with the node's ``/slots`` snapshot; ``cur`` unchanged while slots are off (404/501,
        asked again after SLOTS_RETRY_S) or when the read failed or was refused (counted and kept)."""
        key = (t.group, t.node)
        if self._slots_off.get(key, 0.0) > time.monotonic():
            return cur
        try:
            body = await fetch(session, slots_url(url), timeout=self._timeout, max_bytes=self.max_bytes,
                               headers=_JSON_HEADERS)
            slots = slots_from_json(orjson.loads(body))
        except ScrapeError as exc:
            if exc.status in (404, 501):  # --no-slots: the counters alone (late), no failure
                self._slots_off[key] = time.monotonic() + SLOTS_RETRY_S
                return cur
            self._failed(t, ScrapeError(exc.kind, f"slots: {exc}", exc.status))
            return cur
        except orjson.JSONDecodeError as exc:
            self._failed(t, ScrapeError("parse", f"slots: not JSON: {str(exc)[:80]}"))
            return cur
        except SlotsError as exc:
            self._failed(t, ScrapeError("parse", f"slots: {exc}"))
            return cur
        self._slots_off.pop(key, None)
        return dataclasses.replace(cur, slots=slots)

    def _failed(self, t: Target, exc: ScrapeError) -> None:
        from outlier_admin.observability.metrics import SCRAPE_FAILURES

        SCRAPE_FAILURES.labels(group=t.group, node=t.node, kind=exc.kind).inc()
        self.stats.failures[exc.kind] = self.stats.failures.get(exc.kind, 0) + 1
        key = (t.group, t.node, exc.kind)
        now = time.monotonic()
        if now - self._rejected_at.get(key, -REJECT_EVERY_S) >= REJECT_EVERY_S:
            self._rejected_at[key] = now
            self._rejects.append((t, exc))
            self._wake.set()

    def keep_rejected(self) -> int:
        """Store the failures queued for rejected input, at most one row per node, kind and
        REJECT_EVERY_S across processes (Redis ``SET NX EX``); blocking. Returns the rows stored."""
        from outlier_admin.ingest.models import RejectedInput

        batch, self._rejects = self._rejects, []
        keep = [(t, exc) for t, exc in batch
                if self.r.set(keys.scrape_rejected(t.group, t.node, exc.kind), 1, nx=True, ex=REJECT_EVERY_S)]
        if keep:
            RejectedInput.objects.bulk_create([
                RejectedInput(source=f"metrics:{t.group}/{t.node}"[:100], reason="scrape_failed",
                              detail=f"{exc.kind}: {exc}"[:2000], raw=t.url) for t, exc in keep])
        return len(keep)

    # -- the writer -----------------------------------------------------------------------------
    def _write(self, batch: list[Scrape]) -> int:
        try:
            return write_scrapes(self.r, batch)
        except redis.RedisError as exc:
            # Rows of this batch are lost (a gap in the samples); the counters move on in memory.
            if time.monotonic() - self._write_failed_at > 10:
                self._write_failed_at = time.monotonic()
                log.warning("metrics scrape: %d scrapes not written to Redis: %s", len(batch), exc)
            return 0

    async def flush(self) -> None:
        """Write every scrape queued so far (one MULTI/EXEC, in a thread)."""
        batch, self._pending = self._pending, []
        self._wake.clear()
        if batch:
            self.stats.rows += await asyncio.to_thread(self._write, batch)

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(WRITE_EVERY_S)  # gather what finishes meanwhile into the same write
            await self.flush()
            if self._rejects:
                try:
                    await asyncio.to_thread(_in_own_connection, self.keep_rejected)
                except Exception:  # PostgreSQL or Redis away: the failure is still counted
                    log.exception("metrics scrape: rejected input not kept")

    # -- seeding the previous counters ------------------------------------------------------------
    def read_prev(self, targets: list[Target]) -> dict[tuple[str, str], tuple[float, EngineCounters] | None]:
        """The stored counters of ``targets`` (one HMGET per group); blocking, run it in a thread."""
        by_group: dict[str, list[str]] = {}
        for t in targets:
            by_group.setdefault(t.group, []).append(t.node)
        out: dict[tuple[str, str], tuple[float, EngineCounters] | None] = {}
        for group, nodes in by_group.items():
            for node, raw in zip(nodes, self.r.hmget(keys.itl(group), nodes), strict=True):
                try:
                    out[(group, node)] = decode_prev(raw)
                except (ValueError, TypeError, IndexError):  # a damaged entry re-bases
                    out[(group, node)] = None
        return out

    def session(self) -> aiohttp.ClientSession:
        # limit_per_host=0: a node's coroutine has one request in flight at a time already, and nodes
        # may share a host:port (paths); the total is the bound.
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                         keepalive_timeout=max(30.0, 4 * self.interval_s))
        return aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False,
                                     timeout=self._timeout,
                                     skip_auto_headers=("User-Agent",), raise_for_status=False)

    # -- one round (the beat task, the demo) ------------------------------------------------------
    async def round(self, targets: list[Target]) -> int:
        """Scrape every target once, concurrently, and write; returns the rows queued."""
        self.prev.update(await asyncio.to_thread(self.read_prev, [t for t in targets
                                                                  if (t.group, t.node) not in self.prev]))
        rows_before = self.stats.rows
        async with self.session() as session:
            await asyncio.gather(*(self.scrape(session, t) for t in targets))
        await self.flush()
        return self.stats.rows - rows_before

    # -- the long-running loop of a shard ---------------------------------------------------------
    async def run(self, shard: tuple[int, int] = (0, 1), *, stop: asyncio.Event | None = None,
                  refresh_s: float = 10.0, load: Callable[[tuple[int, int]], list[Target]] = load_targets,
                  lease: bool = True) -> None:
        """Scrape the shard's nodes until ``stop`` is set; the node list is re-read every
        ``refresh_s`` (nodes added, retired or with a new URL) and the lease renewed every second
        (``lease=False``: no lease, for a benchmark on its own node list)."""
        stop = stop or asyncio.Event()
        token = uuid.uuid4().hex
        loops: dict[Target, asyncio.Task] = {}
        writer = asyncio.create_task(self._writer())
        next_refresh = 0.0
        async with self.session() as session:
            try:
                while not stop.is_set():
                    held = await asyncio.to_thread(self._renew, shard, token) if lease else True
                    if held and not self.active:
                        log.info("metrics scrape: shard %d/%d taken", *shard)
                        self.prev.clear()  # another process wrote since: continue from Redis
                        next_refresh = 0.0
                    self.active = held
                    if time.monotonic() >= next_refresh and held:
                        next_refresh = time.monotonic() + refresh_s
                        await self._refresh(session, shard, load, loops)
                    with contextlib.suppress(TimeoutError):  # renew the lease every second
                        await asyncio.wait_for(stop.wait(), timeout=1.0)
            finally:
                for task in [*loops.values(), writer]:
                    task.cancel()
                await asyncio.gather(*loops.values(), writer, return_exceptions=True)
                await self.flush()
                await asyncio.to_thread(_in_own_connection, self.keep_rejected)
                if lease:
                    await asyncio.to_thread(release_lease, self.r, shard, token)

    def _renew(self, shard: tuple[int, int], token: str) -> bool:
        try:
            return renew_lease(self.r, shard, token, lease_ttl_ms(self.interval_s))
        except redis.RedisError as exc:  # Redis away: nothing can be written anyway; keep the state
            log.warning("metrics scrape: lease not renewed: %s", exc)
            return self.active

    async def _refresh(self, session: aiohttp.ClientSession, shard: tuple[int, int],
                       load: Callable[[tuple[int, int]], list[Target]], loops: dict[Target, asyncio.Task]) -> None:
        try:
            targets = set(await asyncio.to_thread(_in_own_connection, load, shard))
        except Exception:  # PostgreSQL away: keep scraping the nodes we know
            log.exception("metrics scrape: node list not refreshed")
            return
        for t in [t for t in loops if t not in targets]:
            loops.pop(t).cancel()
            self._urls.pop(t.url, None)
            self.prev.pop((t.group, t.node), None)
            self._slots_off.pop((t.group, t.node), None)
            self.stats.by_node.pop((t.group, t.node), None)
        new = [t for t in targets if t not in loops]
        if not new:
            return
        self.prev.update(await asyncio.to_thread(self.read_prev, [t for t in new if (t.group, t.node) not in self.prev]))
        for t in new:
            loops[t] = asyncio.create_task(self._node_loop(session, t), name=f"scrape {t.group}/{t.node}")

    async def _node_loop(self, session: aiohttp.ClientSession, t: Target) -> None:
        """Scrape ``t`` at its phase of every period; a slot missed by a slow answer is skipped."""
        loop = asyncio.get_running_loop()
        period = self.interval_s
        phase = (zlib.crc32(f"{t.group}/{t.node}".encode()) % 10_000) / 10_000 * period
        at = loop.time() + phase
        while True:
            await asyncio.sleep(max(0.0, at - loop.time()))
            self.stats.lags.append(loop.time() - at)
            if self.active:
                try:
                    await self.scrape(session, t)
                except Exception:  # a bug must not stop this node's scrapes for good
                    log.exception("metrics scrape of %s/%s failed", t.group, t.node)
            at += period
            behind = loop.time() - at
            if behind > 0:
                missed = int(behind // period) + 1
                self.stats.skipped += missed
                at += missed * period


def _in_own_connection(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread of the service, on a fresh Django connection closed after
    (one broken by a PostgreSQL restart is never reused, and no idle one is held between calls)."""
    from django.db import close_old_connections, connection

    close_old_connections()
    try:
        return fn(*args)
    finally:
        connection.close()


#: The llama.cpp nodes with slots off, kept across the beat's rounds of this worker process (each
#: round is a new Scraper), so they too ask ``/slots`` again only after SLOTS_RETRY_S.
_ROUND_SLOTS_OFF: dict[tuple[str, str], float] = {}


def scrape_round(r: redis.Redis | None = None) -> int:
    """One :meth:`Scraper.round` over every node (all shards); 0 at once while a ``scrape_metrics``
    service holds the scrapes. Returns the rows queued."""
    r = r if r is not None else get_redis()
    if service_alive(r):
        return 0
    targets = load_targets()
    if not targets:
        return 0
    now = time.monotonic()
    for key in [k for k, until in _ROUND_SLOTS_OFF.items() if until <= now]:  # bounded by the live nodes
        del _ROUND_SLOTS_OFF[key]
    scraper = Scraper(r, slots_off=_ROUND_SLOTS_OFF)
    rows = asyncio.run(scraper.round(targets))
    scraper.keep_rejected()  # in the caller's thread (and its transaction, if any)
    return rows


def serve(shard: tuple[int, int], *, refresh_s: float = 10.0, **kwargs: Any) -> Stats:
    """Run the shard's loop in this process until SIGTERM or SIGINT (the management command)."""
    scraper = Scraper(**kwargs)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await scraper.run(shard, stop=stop, refresh_s=refresh_s)

    asyncio.run(main())
    return scraper.stats
