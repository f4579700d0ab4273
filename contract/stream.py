"""One entry of a group's Redis Stream (:func:`contract.keys.stream`): its one encoder and its one decoder.

An entry carries a *batch* of rows, never one record each (one XADD per group per request is what
makes 20k records/s fit on two cores), in one of two fields:

- ``rows``: orjson of request rows laid out as :data:`detector.samples.REQUEST_ROW_FIELDS`
  (``[node, ts, prompt_tokens|null, completion_tokens|null, ttft_ms|null, total_ms, status,
  cached_tokens|null, queue_ms|null]``), written by the ingest pipeline
  (:mod:`outlier_admin.ingest.pipeline`). Token counts are ``null`` in the row of a latency-only
  record (:mod:`contract.normalize`); the tick reads ``null`` as NaN, and rows of 7 written before the
  last two columns as rows whose cached tokens and queue time are unknown.
- ``progress``: orjson of streamed-progress rows laid out as :data:`detector.engine_metrics.ROW_FIELDS`,
  written by the model-server scrapers (:mod:`outlier_admin.ingest.modelserver`).

The group's tick reads, acknowledges and trims the stream (consumer group ``ticks``). The stream is
bounded (:data:`STREAM_MAXLEN` entries, approximate trimming keeps XADD O(1)) so a control plane whose
ticks are stopped cannot fill Redis. The control plane alone writes and reads it: a gateway host
(the agent's distribution, without orjson) imports this module but never calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a gateway host: the stream is the control plane's alone
    orjson = None  # type: ignore[assignment]

from contract import keys

#: Request rows in one entry at most (a larger batch is split over several entries).
ROWS_PER_ENTRY = 5000
#: Entries a group's stream keeps: entries are batches, so this is millions of records.
STREAM_MAXLEN = 200_000

REQUESTS = "rows"
PROGRESS = "progress"


def queue_requests(pipe: Any, group: str, rows: Sequence[Sequence[Any]]) -> None:
    """Queue XADDs of ``rows`` (request rows) on ``pipe``: one entry per :data:`ROWS_PER_ENTRY` rows."""
    for start in range(0, len(rows), ROWS_PER_ENTRY):
        chunk = rows[start : start + ROWS_PER_ENTRY]
        pipe.xadd(keys.stream(group), {REQUESTS: orjson.dumps(chunk)}, maxlen=STREAM_MAXLEN, approximate=True)


def queue_progress(pipe: Any, group: str, rows: Sequence[Sequence[Any]]) -> None:
    """Queue one XADD of ``rows`` (streamed-progress rows) on ``pipe``."""
    pipe.xadd(keys.stream(group), {PROGRESS: orjson.dumps(rows)}, maxlen=STREAM_MAXLEN, approximate=True)


def decode_requests(fields: dict[bytes, bytes]) -> list[list[Any]]:
    """The request rows of one stream entry; none for a progress entry."""
    raw = fields.get(b"rows")
    return orjson.loads(raw) if raw is not None else []


def decode_progress(fields: dict[bytes, bytes]) -> list[list[Any]]:
    """The streamed-progress rows of one stream entry; none for a request entry."""
    raw = fields.get(b"progress")
    return orjson.loads(raw) if raw is not None else []
