"""Model-server scrapes (vLLM, SGLang ``/metrics``) -> streamed progress rows for the detector.

An access-log line arrives when a request ends: a request running when a GPU throttles reports its
decode time seconds later and only partly slowed. The model server itself records every inter-token
gap as it happens, in a Prometheus histogram; the deltas of its cumulative counters between two
scrapes of a node are one progress row (:data:`detector.engine_metrics.ROW_FIELDS`: decode tokens and
time, queue-free prefills, the running batch). What a page gives and how a row is computed is
:mod:`detector.engine_metrics` (which reads only the few sample lines it needs, not the whole page).

This module owns how a scrape is **kept**: the previous cumulative values of each node live in Redis
(``outlier:itl:<group>``, hash node -> ``[ts, *EngineCounters]``), written in the same MULTI/EXEC as
the rows they produced, so whichever process scrapes a node next continues from the last row written
(a counter that went down, a server restart, re-bases without a row). Rows go into the group's
ingest stream next to the access-log records (one entry per group per write, field ``progress``), and
the tick hands them to :meth:`detector.GroupDetector.ingest_progress`.

Who scrapes is :mod:`outlier_admin.ingest.scraper` (asyncio, every node every
``METRICS_SCRAPE_INTERVAL_MS``): the ``scrape_metrics`` service at fleet scale, or one round per
Celery beat entry (:func:`scrape_all`) for the demo and small deployments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import redis

from detector.engine_metrics import EngineCounters, parse, progress_row
from outlier_admin.control.redis_conn import itl_key, stream_key
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.pipeline import STREAM_MAXLEN

NO_ITL = ("no inter-token latency histogram (vllm:inter_token_latency_seconds, "
          "vllm:time_per_output_token_seconds, sglang:inter_token_latency_seconds)")

#: One scrape to keep: ``(group, node, ts, counters, row or None)``.
Scrape = tuple[str, str, float, EngineCounters, "list[Any] | None"]


def read_counters(text: str) -> EngineCounters:
    """The counters of one page; ``ValueError`` when it is not a model server's (no inter-token
    histogram) or a sample we read is not a number."""
    cur = parse(text)
    if cur is None:
        raise ValueError(NO_ITL)
    return cur


def decode_prev(raw: bytes | None) -> tuple[float, EngineCounters] | None:
    """A stored ``[ts, *counters]`` (before the prefill columns: ``[ts, itl_sum_s, itl_count]``)."""
    if not raw:
        return None
    stored = orjson.loads(raw)
    return float(stored[0]), EngineCounters.from_list(stored[1:])


def queued(row: list[Any] | None) -> bool:
    """Whether a row goes to the stream: an idle interval (no token, no prefill) says nothing."""
    return row is not None and (row[3] > 0 or (row[5] or 0) > 0)


def write_scrapes(r: redis.Redis, scrapes: Iterable[Scrape]) -> int:
    """Keep scrapes in one MULTI/EXEC: every node's counters, and each group's queued rows as one
    stream entry; returns the rows queued."""
    counters: dict[str, dict[str, bytes]] = {}
    rows_by_group: dict[str, list[list[Any]]] = {}
    for group, node, ts, cur, row in scrapes:
        counters.setdefault(group, {})[node] = orjson.dumps([ts, *cur.to_list()])
        if queued(row):
            rows_by_group.setdefault(group, []).append(row)  # type: ignore[arg-type]
    pipe = r.pipeline(transaction=True)
    for group, by_node in counters.items():  # one command per group, not per node
        pipe.hset(itl_key(group), mapping=by_node)  # type: ignore[arg-type]
    for group, rows in rows_by_group.items():
        pipe.xadd(stream_key(group), {"progress": orjson.dumps(rows)}, maxlen=STREAM_MAXLEN, approximate=True)
    pipe.execute()
    return sum(len(rows) for rows in rows_by_group.values())


def record_scrape(r: redis.Redis, node: Node, text: str, now: float) -> list[Any] | None:
    """Turn one scrape of ``node`` into a progress row in its group's stream (previous values read
    from Redis); returns the row. Raises ``ValueError`` as :func:`read_counters`."""
    cur = read_counters(text)
    prev = decode_prev(r.hget(itl_key(node.group.name), node.name))
    row = progress_row(node.name, prev, now, cur)
    write_scrapes(r, [(node.group.name, node.name, now, cur, row)])
    return row


def scrape_all() -> int:
    """One round over every node with a ``metrics_url`` (concurrent, each with its timeout); returns
    the progress rows queued (a node that streamed nothing since its last scrape queues none). Does
    nothing while a ``scrape_metrics`` service holds the scrapes (:func:`scraper.service_alive`)."""
    from outlier_admin.ingest.scraper import scrape_round

    return scrape_round()
