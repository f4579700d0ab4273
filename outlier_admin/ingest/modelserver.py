"""Model-server scrapes (vLLM, SGLang ``/metrics``) -> streamed decode progress for the detector.

An access-log line arrives when a request ends: a request running when a GPU throttles reports its
decode time seconds later and only partly slowed. The model server itself records every inter-token
gap as it happens, in a Prometheus histogram; the delta of its ``_sum`` and ``_count`` between two
scrapes is exactly a :class:`detector.ProgressBatch` row (``tokens = Δcount``,
``token_ms = 1000 * Δsum``, ``interval_s`` = time between the scrapes). Histograms read, first found:

- ``vllm:inter_token_latency_seconds`` (vLLM V1), ``vllm:time_per_output_token_seconds`` (V0),
- ``sglang:inter_token_latency_seconds``.

All label sets (one per served model) are summed. The previous cumulative values live in Redis
(``outlier:itl:<group>``, one field per node); a counter that went down (server restart) re-bases
without a row. Rows go into the group's ingest stream next to the access-log records, and the tick
hands them to :meth:`detector.GroupDetector.ingest_progress`. Parsing uses
``prometheus_client.parser``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import redis
from django.conf import settings

from detector.engine_metrics import EngineCounters, parse, progress_row
from outlier_admin.control.redis_conn import get_redis, itl_key, stream_key
from outlier_admin.fleet.models import Node
from outlier_admin.fleet.names import validate_scrape_url
from outlier_admin.ingest.models import RejectedInput
from outlier_admin.ingest.pipeline import STREAM_MAXLEN


def record_scrape(r: redis.Redis, node: Node, text: str, now: float) -> list[Any] | None:
    """Turn one scrape of ``node`` into a progress row in its group's stream; returns the row.

    Raises ``ValueError`` when the text is not Prometheus exposition or has no inter-token histogram.
    """
    cur = parse(text)
    if cur is None:
        raise ValueError("no inter-token latency histogram (vllm:inter_token_latency_seconds, "
                         "vllm:time_per_output_token_seconds, sglang:inter_token_latency_seconds)")
    key = itl_key(node.group.name)
    raw = r.hget(key, node.name)
    prev = None
    if raw:
        # [ts, *counters]; before the prefill columns it was [ts, itl_sum_s, itl_count].
        stored = orjson.loads(raw)
        prev = (stored[0], EngineCounters.from_list(stored[1:]))
    row = progress_row(node.name, prev, now, cur)
    pipe = r.pipeline(transaction=True)
    pipe.hset(key, node.name, orjson.dumps([now, *cur.to_list()]))
    if row is not None and (row[3] > 0 or (row[5] or 0) > 0):
        pipe.xadd(stream_key(node.group.name), {"progress": orjson.dumps([row])},
                  maxlen=STREAM_MAXLEN, approximate=True)
    pipe.execute()
    return row


def scrape_node(node: Node, *, client: httpx.Client, r: redis.Redis) -> list[Any] | None:
    """GET the node's ``metrics_url`` and record it; a failed scrape is kept as rejected input."""
    try:
        # Re-checked at each scrape (a row written before validation existed); never a redirect.
        resp = client.get(validate_scrape_url(node.metrics_url), follow_redirects=False)
        resp.raise_for_status()
        return record_scrape(r, node, resp.text, time.time())
    except (httpx.HTTPError, ValueError) as exc:
        RejectedInput.objects.create(source=f"metrics:{node}", reason="scrape_failed", detail=str(exc)[:2000],
                                     raw=node.metrics_url)
        return None


def scrape_all() -> int:
    """Scrape every node with a ``metrics_url``; returns the number of progress rows queued (a node
    that streamed no token since its last scrape queues none)."""
    n = 0
    r = get_redis()
    with httpx.Client(timeout=settings.METRICS_TIMEOUT_MS / 1000.0) as client:
        for node in Node.objects.filter(retired=False).exclude(metrics_url="").select_related("group"):
            row = scrape_node(node, client=client, r=r)
            n += row is not None and row[3] > 0
    return n
