"""Per-request samples, their validation, and the seed's per-request signal formulas.

A sample is what a gateway sees of one request: the node it went to, when it finished, prompt and
completion token counts, time to first token (``NaN`` when the gateway does not log it, as nginx), total
latency and HTTP status. Batches are columnar (one numpy array per field) so that a tick's worth of
samples for many nodes is processed in a few vectorised operations.

Status semantics (why: a crashed node that answers 503 in 2 ms must not look *fast*):

- 2xx / 3xx: a latency sample;
- 0: a *cancellation*: the client gave up (its deadline passed, or it disconnected) before the node
  answered: a latency sample (its latency is a lower bound on the truth, still evidence of slowness),
  **never an error**. A client's deadline is the client's, not the node's: near saturation a healthy
  node's queue wait reaches it by chance, and counting those as errors ejected healthy nodes into a
  cascade (in the simulator's seed drill at 55 % load: 26,682 timeouts, against 15 without). Envoy's
  outlier detection likewise never hears of a downstream disconnect; the latency detectors, which
  know the queue from the node, judge it;
- 408, 504: a *timeout* the server or the gateway itself produced (the gateway's upstream timeout:
  Envoy's "local origin" timeout, which its default outlier detection counts as a 5xx): an error
  **and** a latency sample, so a hung node behind a gateway timeout is still ejected;
- any other 5xx: an error only;
- any other 4xx: the client's fault, counted but neither latency nor error.

Signal formulas (seed 000 and the issue's definitions):

- ``seed_norm  = total / (prompt * w + completion)``
- ``prefill    = ttft / max(prompt, 1)``            (ms per prompt token)
- ``decode     = (total - ttft) / max(completion - 1, 1)``  (ms per output token after the first)

A completed request reports its decode time late: a request that is running when a GPU throttles
completes seconds later and only partly slowed. A gateway that streams (server-sent events) sees
every token as it leaves the node, and the model server counts them too (vLLM's
``inter_token_latency_seconds`` histogram). :class:`ProgressBatch` carries that view: per node and
interval, the output tokens its in-flight requests streamed and the inter-token time they took:

- ``decode     = token_ms / tokens``                 (ms per output token, streamed)
- ``streams    = token_ms / (interval_s * 1000)``    (mean number of requests decoding)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from contract.records import FIELDS, STATUS, UNLIMITED, Limits, fields_ok
from detector.engine_metrics import ROW_FIELDS


class RejectReason(enum.StrEnum):
    """Why a sample was refused. Every refused sample is counted under one of these codes."""

    NOT_FINITE = "not_finite"
    NEGATIVE = "negative"
    TOTAL_BELOW_TTFT = "total_below_ttft"
    NO_TOKENS = "no_tokens"
    BAD_STATUS = "bad_status"
    UNKNOWN_NODE = "unknown_node"
    #: Finite and not negative, but outside the records contract's bounds (:mod:`contract.records`).
    OUT_OF_BOUNDS = "out_of_bounds"


TIMEOUT_STATUSES = (0, 408, 504)
#: Of those, the client's own cancellation (see the module docstring): latency, never an error.
CANCELLED_STATUSES = (0,)


#: The layout of a request row in a group's ingest stream (``outlier_admin.ingest.pipeline`` writes
#: it, the tick reads it with :meth:`SampleBatch.from_rows`); rows of 7 predate the last two columns.
REQUEST_ROW_FIELDS: tuple[str, ...] = (
    "node", "ts", "prompt_tokens", "completion_tokens", "ttft_ms", "total_ms", "status", "cached_tokens", "queue_ms",
)


def _columns(rows: Sequence[Sequence[Any]], width: int, kind: str) -> list[tuple[Any, ...]]:
    """The columns of ``rows``, shorter rows padded with ``None`` (unknown) to ``width``."""
    if any(len(r) != width for r in rows):
        rows = [list(r) + [None] * (width - len(r)) for r in rows]
        if any(len(r) != width for r in rows):
            raise ValueError(f"a {kind} row has {width} fields at most")
    return list(zip(*rows, strict=True)) if rows else [()] * width


def _optional(values: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray:
    """An optional float column: ``None`` -> all NaN (unknown)."""
    return np.full(n, np.nan) if values is None else np.asarray(values, dtype=np.float64)


class _Columns:
    """What the columnar batches share: one numpy array per dataclass field, all of one length."""

    ts: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, index: np.ndarray) -> Self:
        """The sub-batch at ``index`` (a boolean mask or integer indices)."""
        if index.dtype == bool and len(index) == len(self) and index.all():
            return self
        return type(self)(**{f: getattr(self, f)[index] for f in self.__dataclass_fields__})  # type: ignore[attr-defined]

    def _checked(self) -> Self:
        if len({len(getattr(self, f)) for f in self.__dataclass_fields__}) != 1:  # type: ignore[attr-defined]
            raise ValueError(f"{type(self).__name__} columns must all have the same length")
        return self


@dataclass(frozen=True)
class SampleBatch(_Columns):
    """Columnar batch of request samples. ``node`` holds node ids (str); the rest are numeric."""

    node: np.ndarray  # object (str)
    ts: np.ndarray  # float64, epoch seconds
    prompt_tokens: np.ndarray  # float64 (integers)
    completion_tokens: np.ndarray  # float64 (integers)
    ttft_ms: np.ndarray  # float64, NaN when unknown
    total_ms: np.ndarray  # float64
    status: np.ndarray  # int64
    cached_tokens: np.ndarray  # float64, prompt tokens served from the prefix cache; NaN when unknown
    queue_ms: np.ndarray  # float64, the wait for a batch slot inside TTFT; NaN when unknown

    @classmethod
    def from_columns(
        cls,
        *,
        node: Sequence[str] | np.ndarray,
        ts: Sequence[float] | np.ndarray,
        prompt_tokens: Sequence[float] | np.ndarray,
        completion_tokens: Sequence[float] | np.ndarray,
        total_ms: Sequence[float] | np.ndarray,
        ttft_ms: Sequence[float] | np.ndarray | None = None,
        status: Sequence[int] | np.ndarray | None = None,
        cached_tokens: Sequence[float] | np.ndarray | None = None,
        queue_ms: Sequence[float] | np.ndarray | None = None,
    ) -> SampleBatch:
        n = len(node)
        st = np.full(n, 200, dtype=np.int64) if status is None else np.asarray(status, dtype=np.int64)
        return cls(
            node=np.asarray(node, dtype=object),
            ts=np.asarray(ts, dtype=np.float64),
            prompt_tokens=np.asarray(prompt_tokens, dtype=np.float64),
            completion_tokens=np.asarray(completion_tokens, dtype=np.float64),
            ttft_ms=_optional(ttft_ms, n),
            total_ms=np.asarray(total_ms, dtype=np.float64),
            status=st,
            cached_tokens=_optional(cached_tokens, n),
            queue_ms=_optional(queue_ms, n),
        )._checked()

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> SampleBatch:
        """From rows laid out as :data:`REQUEST_ROW_FIELDS` (``None``: unknown, as a JSON ``null``);
        shorter rows (written before the later columns existed) read their missing columns as
        unknown."""
        width = len(REQUEST_ROW_FIELDS)
        cols = _columns(rows, width, "request")
        numeric = [i for i, name in enumerate(REQUEST_ROW_FIELDS) if name not in ("node", "status")]
        # One 2-D conversion for every numeric column (None -> NaN), not one list per column.
        table = np.array([cols[i] for i in numeric], dtype=np.float64).reshape(len(numeric), -1)
        num = {REQUEST_ROW_FIELDS[i]: table[k] for k, i in enumerate(numeric)}
        return cls.from_columns(node=cols[0], status=np.array(cols[6], dtype=np.int64), **num)

    def latency_only(self) -> np.ndarray:
        """Requests logged without token counts (both NaN): judged on their latency alone."""
        return np.isnan(self.prompt_tokens) & np.isnan(self.completion_tokens)

    def computed_prompt(self) -> np.ndarray:
        """Prompt tokens the node actually computed: ``prompt - cached`` where the log reports cached
        tokens (a prefix-cache hit makes prefill legitimately short), else ``prompt``."""
        cached = np.where(np.isfinite(self.cached_tokens), self.cached_tokens, 0.0)
        return np.maximum(self.prompt_tokens - np.minimum(cached, self.prompt_tokens), 0.0)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> SampleBatch:
        """Build from dicts with keys node, ts, total_ms, and optional prompt_tokens and
        completion_tokens (both missing: a latency-only record), ttft_ms, cached_tokens, queue_ms
        (None/missing -> NaN) and status (missing -> 200)."""
        rows = list(records)

        def col(key: str, default: Any) -> list[Any]:
            out = []
            for r in rows:
                v = r.get(key, default)
                out.append(default if v is None else v)
            return out

        return cls.from_columns(
            node=[str(r["node"]) for r in rows],
            ts=col("ts", np.nan),
            prompt_tokens=col("prompt_tokens", np.nan),
            completion_tokens=col("completion_tokens", np.nan),
            ttft_ms=col("ttft_ms", np.nan),
            total_ms=col("total_ms", np.nan),
            status=col("status", 200),
            cached_tokens=col("cached_tokens", np.nan),
            queue_ms=col("queue_ms", np.nan),
        )

    @classmethod
    def empty(cls) -> SampleBatch:
        return cls.from_columns(node=[], ts=[], prompt_tokens=[], completion_tokens=[], total_ms=[])


def validate(batch: SampleBatch, limits: Limits = UNLIMITED) -> tuple[np.ndarray, list[tuple[int, RejectReason]]]:
    """Check every sample; return the boolean mask of valid ones and ``(index, reason)`` for the rest.

    The rules are the records contract's (:mod:`contract.records`, the table ingest checks too), with
    the operator-set bounds of ``limits`` (none by default: every record from ingest passed them):
    timestamps and total latency must be finite, token counts too unless both are missing (a
    latency-only record: a log format without token counts); optional columns (TTFT, cached tokens,
    queue time) finite when present; no value may be negative; when TTFT is known, ``total >= ttft``;
    a request with 0 prompt and 0 completion tokens carries no signal; the status must be 0 or a
    valid HTTP code; every other bound of the table (:attr:`RejectReason.OUT_OF_BOUNDS`). The first
    failing rule is reported.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        tokens_finite = np.isfinite(batch.prompt_tokens) & np.isfinite(batch.completion_tokens)
        finite = (
            np.isfinite(batch.ts)
            & (tokens_finite | batch.latency_only())
            & np.isfinite(batch.total_ms)
            & ~np.isinf(batch.ttft_ms)
            & ~np.isinf(batch.cached_tokens)
            & ~np.isinf(batch.queue_ms)
        )
        negative = (
            (batch.prompt_tokens < 0)
            | (batch.completion_tokens < 0)
            | (batch.total_ms < 0)
            | (batch.ttft_ms < 0)
            | (batch.cached_tokens < 0)
            | (batch.queue_ms < 0)
        )
        return _first_failing(len(batch), [
            (~finite, RejectReason.NOT_FINITE),
            (negative, RejectReason.NEGATIVE),
            (batch.total_ms < batch.ttft_ms, RejectReason.TOTAL_BELOW_TTFT),
            ((batch.prompt_tokens == 0) & (batch.completion_tokens == 0), RejectReason.NO_TOKENS),
            (~STATUS.within(batch.status, STATUS.high), RejectReason.BAD_STATUS),
            (_out_of_bounds(batch, limits), RejectReason.OUT_OF_BOUNDS),
        ])


def _out_of_bounds(batch: SampleBatch, limits: Limits) -> np.ndarray:
    """Where a given number is outside its bounds in the records contract (a value not given, NaN,
    is not read; ``needs``: cached tokens only with both counts, queue time only with TTFT)."""
    values = {name: getattr(batch, name) for name in FIELDS}
    given = {name: ~np.isnan(x) if x.dtype.kind == "f" else np.ones(len(x), bool) for name, x in values.items()}
    return ~fields_ok(values, given, limits)


def _first_failing(n: int, rules: list[tuple[np.ndarray, RejectReason]]
                   ) -> tuple[np.ndarray, list[tuple[int, RejectReason]]]:
    """``(valid mask, [(index, reason)])`` where each refused row carries the first rule it fails."""
    reason = np.full(n, -1, dtype=np.int8)
    codes = list(RejectReason)
    for failed, r in rules:
        reason[(reason < 0) & failed] = codes.index(r)
    bad = np.flatnonzero(reason >= 0)
    return reason < 0, [(int(i), codes[reason[i]]) for i in bad]


def classify_status(status: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(is_latency_sample, is_error)`` per the module's status semantics: a cancellation (status 0)
    is a latency sample and not an error."""
    timeout = np.isin(status, TIMEOUT_STATUSES)
    ok = (status >= 200) & (status < 400)
    error = (timeout | (status >= 500)) & ~np.isin(status, CANCELLED_STATUSES)
    return ok | timeout, error


def is_cancelled(status: np.ndarray) -> np.ndarray:
    """The client went away before an answer (status 0): no outcome for the error detectors."""
    return np.isin(status, CANCELLED_STATUSES)


def seed_norm(batch: SampleBatch, prompt_weight: float) -> np.ndarray:
    """Seed 000: ``total / (prompt * w + completion)`` (ms per weighted token)."""
    denom = batch.prompt_tokens * prompt_weight + batch.completion_tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, batch.total_ms / denom, np.nan)


def prefill_time_ms(batch: SampleBatch) -> np.ndarray:
    """``ttft - queue``: the queue-free prefill time of a request whose log carries both (NaN else)."""
    return np.where(batch.queue_ms <= batch.ttft_ms, batch.ttft_ms - batch.queue_ms, np.nan)


def prefill_per_token(batch: SampleBatch) -> np.ndarray:
    """``ttft / max(prompt, 1)`` in ms per prompt token; NaN where TTFT is unknown."""
    return batch.ttft_ms / np.maximum(batch.prompt_tokens, 1.0)


def decode_per_token(batch: SampleBatch) -> np.ndarray:
    """``(total - ttft) / max(completion - 1, 1)`` in ms per output token; NaN where TTFT is unknown
    or the request produced fewer than 2 tokens (no inter-token time to measure)."""
    out = (batch.total_ms - batch.ttft_ms) / np.maximum(batch.completion_tokens - 1.0, 1.0)
    return np.where(batch.completion_tokens >= 2, out, np.nan)


def node_order(node: np.ndarray) -> np.ndarray | None:
    """Stable permutation grouping samples by node index, or ``None`` when they already are.

    Time order within each node survives (the sort is stable). Indices below 2^16 are sorted as
    ``uint16``, for which numpy's stable sort is a radix sort: about 3x faster than on ``int64`` at
    100,000 samples, and ingestion sorts once per batch so that the per-signal updates need not.
    """
    if len(node) < 2 or not np.any(node[1:] < node[:-1]):
        return None
    key = node.astype(np.uint16) if int(node.max()) < 1 << 16 else node
    return np.argsort(key, kind="stable")


@dataclass(frozen=True)
class ProgressBatch(_Columns):
    """Columnar batch of streamed progress: one row per node and interval (see
    :mod:`detector.engine_metrics` for how a model server's ``/metrics`` becomes a row).

    ``tokens`` is the number of output tokens the node's in-flight requests streamed during the
    ``interval_s`` seconds that end at ``ts``; ``token_ms`` the sum of their inter-token gaps (ms),
    i.e. the delta of a ``_sum`` and ``_count`` pair of an inter-token-latency histogram. Optional
    (NaN when the server does not report them): ``prefills`` requests whose queue-free prefill took
    ``prefill_ms`` in all and computed ``prefill_tokens`` prompt tokens (cache hits excluded), and
    ``running``, the size of the node's running batch at ``ts``, ``prefill_work``, the prompt
    tokens it processed during the interval (prefill chunks share every step with the decodes), and
    ``kv_usage``, its KV cache's fill at ``ts``, and ``preempted``, the requests it preempted during
    the interval (their KV cache evicted, to be recomputed).
    """

    node: np.ndarray  # object (str)
    ts: np.ndarray  # float64, epoch seconds (end of the interval)
    interval_s: np.ndarray  # float64
    tokens: np.ndarray  # float64 (integers)
    token_ms: np.ndarray  # float64
    prefills: np.ndarray  # float64, NaN: unknown
    prefill_ms: np.ndarray  # float64, NaN: unknown
    prefill_tokens: np.ndarray  # float64, NaN: unknown
    running: np.ndarray  # float64, NaN: unknown
    prefill_work: np.ndarray  # float64, prompt tokens processed in the interval; NaN: unknown
    kv_usage: np.ndarray  # float64, KV-cache fill (0..1) at ts; NaN: unknown
    preempted: np.ndarray  # float64, requests preempted in the interval; NaN: unknown

    @classmethod
    def from_columns(
        cls,
        *,
        node: Sequence[str] | np.ndarray,
        ts: Sequence[float] | np.ndarray,
        interval_s: Sequence[float] | np.ndarray,
        tokens: Sequence[float] | np.ndarray,
        token_ms: Sequence[float] | np.ndarray,
        prefills: Sequence[float] | np.ndarray | None = None,
        prefill_ms: Sequence[float] | np.ndarray | None = None,
        prefill_tokens: Sequence[float] | np.ndarray | None = None,
        running: Sequence[float] | np.ndarray | None = None,
        prefill_work: Sequence[float] | np.ndarray | None = None,
        kv_usage: Sequence[float] | np.ndarray | None = None,
        preempted: Sequence[float] | np.ndarray | None = None,
    ) -> ProgressBatch:
        n = len(node)
        return cls(
            node=np.asarray(node, dtype=object),
            ts=np.asarray(ts, dtype=np.float64),
            interval_s=np.asarray(interval_s, dtype=np.float64),
            tokens=np.asarray(tokens, dtype=np.float64),
            token_ms=np.asarray(token_ms, dtype=np.float64),
            prefills=_optional(prefills, n),
            prefill_ms=_optional(prefill_ms, n),
            prefill_tokens=_optional(prefill_tokens, n),
            running=_optional(running, n),
            prefill_work=_optional(prefill_work, n),
            kv_usage=_optional(kv_usage, n),
            preempted=_optional(preempted, n),
        )._checked()

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> ProgressBatch:
        """From rows laid out as :data:`detector.engine_metrics.ROW_FIELDS` (``None``: unknown); rows
        of 5 (decode only, written before the prefill columns existed) are read too."""
        width = len(ROW_FIELDS)
        cols = _columns(rows, width, "progress")
        table = np.array(cols[1:], dtype=np.float64).reshape(width - 1, -1)  # None -> NaN
        return cls.from_columns(node=cols[0], **dict(zip(ROW_FIELDS[1:], table, strict=True)))

    def decode_ms(self) -> np.ndarray:
        """``token_ms / tokens``: the mean time per streamed output token, per row."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.token_ms / self.tokens

    def work_per_token(self) -> np.ndarray:
        """``prefill_work / tokens``: the prompt tokens processed per decode token, per row (NaN for a
        row that streamed no token): the prefill load every decode step of the interval shared."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.tokens > 0, self.prefill_work / self.tokens, np.nan)

    def streams(self) -> np.ndarray:
        """``token_ms / (interval_s * 1000)``: how many requests were decoding, on average."""
        return self.token_ms / (self.interval_s * 1000.0)


def validate_progress(batch: ProgressBatch) -> tuple[np.ndarray, list[tuple[int, RejectReason]]]:
    """Check every progress row, like :func:`validate`: all values finite (the optional ones when
    present), none negative, an interval longer than 0. Rows with 0 tokens are valid (the node
    streamed nothing) and carry no decode signal."""
    optional = (batch.prefills, batch.prefill_ms, batch.prefill_tokens, batch.running, batch.prefill_work,
                batch.kv_usage, batch.preempted)
    with np.errstate(invalid="ignore"):
        finite = (np.isfinite(batch.ts) & np.isfinite(batch.interval_s) & np.isfinite(batch.tokens)
                  & np.isfinite(batch.token_ms))
        negative = (batch.interval_s <= 0) | (batch.tokens < 0) | (batch.token_ms < 0)
        for col in optional:
            finite &= ~np.isinf(col)
            negative |= col < 0
        return _first_failing(len(batch), [(~finite, RejectReason.NOT_FINITE), (negative, RejectReason.NEGATIVE)])
