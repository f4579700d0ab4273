"""Model-server scrapes (vLLM, SGLang, llama.cpp, TGI, TensorRT-LLM ``/metrics``; llama.cpp's
``/slots``) -> streamed progress rows for the detector.

An access-log line arrives when a request ends: a request running when a GPU throttles reports its
decode time seconds later and only partly slowed. The model server itself records every inter-token
gap as it happens, in a Prometheus histogram; the deltas of its cumulative counters between two
scrapes of a node are one progress row (:data:`detector.engine_metrics.ROW_FIELDS`: decode tokens and
time, queue-free prefills, the running batch). What a page gives and how a row is computed is
:mod:`detector.engine_metrics` (which reads only the few sample lines it needs, not the whole page;
its "Engines" section says what each server can and cannot show, live or only when a request ends).
A page no engine wrote is refused as :class:`UnrecognisedEngine` (a scrape failure of its own kind,
never an empty row).

This module owns how a scrape is **kept**: the previous cumulative values of each node live in Redis
(:func:`contract.keys.itl`, hash node -> ``[ts, *EngineCounters]``, a llama.cpp node's last ``/slots``
snapshot included), written in the same MULTI/EXEC as the rows they produced, so whichever process scrapes a node next continues from the last row written
(a counter that went down, a server restart, re-bases without a row). Rows go into the group's
ingest stream next to the access-log records (one entry per group per write, field ``progress``), and
the tick hands them to :meth:`detector.GroupDetector.ingest_progress`.

Who scrapes is :mod:`outlier_admin.ingest.scraper` (asyncio, every node every
``METRICS_SCRAPE_INTERVAL_MS``): the ``scrape_metrics`` service at fleet scale, or one round per
Celery beat entry (:func:`~outlier_admin.ingest.scraper.scrape_round`) for the demo and small deployments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import redis

from contract import keys, stream
from contract.topology import is_cluster
from detector.engine_metrics import ENGINES, EngineCounters, advance, parse
from outlier_admin.fleet.models import Node

NOT_AN_ENGINE = (f"not a model server page this parser knows ({', '.join(ENGINES)}): no vLLM/SGLang "
                 "inter-token histogram, no llamacpp:, tgi_, trtllm_ or nv_trt_llm_ families")


class UnrecognisedEngine(ValueError):
    """A ``/metrics`` page that no engine of :data:`detector.engine_metrics.ENGINES` wrote."""

#: One scrape to keep: ``(group, node, ts, counters, row or None)``.
Scrape = tuple[str, str, float, EngineCounters, "list[Any] | None"]


def read_counters(text: str) -> EngineCounters:
    """The counters of one page; :class:`UnrecognisedEngine` when no engine we read wrote it,
    ``ValueError`` when a sample we read is not a number."""
    cur = parse(text)
    if cur is None:
        raise UnrecognisedEngine(NOT_AN_ENGINE)
    return cur


def decode_prev(raw: bytes | None) -> tuple[float, EngineCounters] | None:
    """A stored ``[ts, *counters]`` (before the prefill columns: ``[ts, itl_sum_s, itl_count]``)."""
    if not raw:
        return None
    stored = orjson.loads(raw)
    return float(stored[0]), EngineCounters.from_list(stored[1:])


def queued(row: list[Any] | None) -> bool:
    """Whether a row goes to the stream: an idle interval (no token, no decode time, no prefill) says
    nothing. A row with decode time and no token is a stalled node (a censored observation): kept."""
    return row is not None and (row[3] > 0 or row[4] > 0 or (row[5] or 0) > 0)


def write_scrapes(r: redis.Redis, scrapes: Iterable[Scrape]) -> int:
    """Keep scrapes in one MULTI/EXEC: every node's counters, and each group's queued rows as one
    stream entry; returns the rows queued."""
    counters: dict[str, dict[str, bytes]] = {}
    rows_by_group: dict[str, list[list[Any]]] = {}
    for group, node, ts, cur, row in scrapes:
        counters.setdefault(group, {})[node] = orjson.dumps([ts, *cur.to_list()])
        if queued(row):
            rows_by_group.setdefault(group, []).append(row)  # type: ignore[arg-type]
    # One MULTI: a group's counters and the rows computed from them land together. A Redis Cluster runs
    # a transaction within one slot only, so there it is one MULTI per group (a group is one slot).
    groups = sorted(counters.keys() | rows_by_group.keys())
    for batch in ([[g] for g in groups] if is_cluster(r) else [groups]):
        pipe = r.pipeline(transaction=True)
        for group in batch:  # one command per group, not per node
            if group in counters:
                pipe.hset(keys.itl(group), mapping=counters[group])  # type: ignore[arg-type]
            if group in rows_by_group:
                stream.queue_progress(pipe, group, rows_by_group[group])
        pipe.execute()
    return sum(len(rows) for rows in rows_by_group.values())


def record_scrape(r: redis.Redis, node: Node, text: str, now: float) -> list[Any] | None:
    """Turn one scrape of ``node`` into a progress row in its group's stream (previous values read
    from Redis); returns the row. Raises ``ValueError`` as :func:`read_counters`."""
    cur = read_counters(text)
    prev = decode_prev(r.hget(keys.itl(node.group.name), node.name))
    row, cur = advance(node.name, prev, now, cur)
    write_scrapes(r, [(node.group.name, node.name, now, cur, row)])
    return row
