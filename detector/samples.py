"""Per-request samples, their validation, and the seed's per-request signal formulas.

A sample is what a gateway sees of one request: the node it went to, when it finished, prompt and
completion token counts, time to first token (``NaN`` when the gateway does not log it, as nginx), total
latency and HTTP status. Batches are columnar (one numpy array per field) so that a tick's worth of
samples for many nodes is processed in a few vectorised operations.

Status semantics (why: a crashed node that answers 503 in 2 ms must not look *fast*):

- 2xx / 3xx: a latency sample;
- 0 (client gave up / connection failed), 408, 504: a *timeout* — an error **and** a latency sample
  (its latency is a lower bound on the truth, still evidence of slowness);
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


class RejectReason(enum.StrEnum):
    """Why a sample was refused. Every refused sample is counted under one of these codes."""

    NOT_FINITE = "not_finite"
    NEGATIVE = "negative"
    TOTAL_BELOW_TTFT = "total_below_ttft"
    NO_TOKENS = "no_tokens"
    BAD_STATUS = "bad_status"
    UNKNOWN_NODE = "unknown_node"


TIMEOUT_STATUSES = (0, 408, 504)


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
    ) -> SampleBatch:
        n = len(node)
        ttft = np.full(n, np.nan) if ttft_ms is None else np.asarray(ttft_ms, dtype=np.float64)
        st = np.full(n, 200, dtype=np.int64) if status is None else np.asarray(status, dtype=np.int64)
        return cls(
            node=np.asarray(node, dtype=object),
            ts=np.asarray(ts, dtype=np.float64),
            prompt_tokens=np.asarray(prompt_tokens, dtype=np.float64),
            completion_tokens=np.asarray(completion_tokens, dtype=np.float64),
            ttft_ms=ttft,
            total_ms=np.asarray(total_ms, dtype=np.float64),
            status=st,
        )._checked()

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> SampleBatch:
        """Build from dicts with keys node, ts, prompt_tokens, completion_tokens, total_ms,
        and optional ttft_ms (None/missing -> NaN) and status (missing -> 200)."""
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
        )

    @classmethod
    def empty(cls) -> SampleBatch:
        return cls.from_columns(node=[], ts=[], prompt_tokens=[], completion_tokens=[], total_ms=[])


def validate(batch: SampleBatch) -> tuple[np.ndarray, list[tuple[int, RejectReason]]]:
    """Check every sample; return the boolean mask of valid ones and ``(index, reason)`` for the rest.

    Rules: timestamps, token counts and total latency must be finite; no value may be negative; when
    TTFT is known, ``total >= ttft``; a request with 0 prompt and 0 completion tokens carries no
    signal; the status must be 0 or a valid HTTP code (100..599). The first failing rule is reported.
    """
    with np.errstate(invalid="ignore"):
        finite = (
            np.isfinite(batch.ts)
            & np.isfinite(batch.prompt_tokens)
            & np.isfinite(batch.completion_tokens)
            & np.isfinite(batch.total_ms)
            & ~np.isinf(batch.ttft_ms)
        )
        negative = (
            (batch.prompt_tokens < 0)
            | (batch.completion_tokens < 0)
            | (batch.total_ms < 0)
            | (batch.ttft_ms < 0)
        )
        bad_status = (batch.status != 0) & ((batch.status < 100) | (batch.status > 599))
        return _first_failing(len(batch), [
            (~finite, RejectReason.NOT_FINITE),
            (negative, RejectReason.NEGATIVE),
            (batch.total_ms < batch.ttft_ms, RejectReason.TOTAL_BELOW_TTFT),
            ((batch.prompt_tokens == 0) & (batch.completion_tokens == 0), RejectReason.NO_TOKENS),
            (bad_status, RejectReason.BAD_STATUS),
        ])


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
    """``(is_latency_sample, is_error)`` per the module's status semantics."""
    timeout = np.isin(status, TIMEOUT_STATUSES)
    ok = (status >= 200) & (status < 400)
    error = timeout | (status >= 500)
    return ok | timeout, error


def seed_norm(batch: SampleBatch, prompt_weight: float) -> np.ndarray:
    """Seed 000: ``total / (prompt * w + completion)`` (ms per weighted token)."""
    denom = batch.prompt_tokens * prompt_weight + batch.completion_tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, batch.total_ms / denom, np.nan)


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
    """Columnar batch of streamed decode progress: one row per node and interval.

    ``tokens`` is the number of output tokens the node's in-flight requests streamed during the
    ``interval_s`` seconds that end at ``ts``; ``token_ms`` the sum of their inter-token gaps (ms),
    i.e. the delta of a ``_sum`` and ``_count`` pair of an inter-token-latency histogram.
    """

    node: np.ndarray  # object (str)
    ts: np.ndarray  # float64, epoch seconds (end of the interval)
    interval_s: np.ndarray  # float64
    tokens: np.ndarray  # float64 (integers)
    token_ms: np.ndarray  # float64

    @classmethod
    def from_columns(
        cls,
        *,
        node: Sequence[str] | np.ndarray,
        ts: Sequence[float] | np.ndarray,
        interval_s: Sequence[float] | np.ndarray,
        tokens: Sequence[float] | np.ndarray,
        token_ms: Sequence[float] | np.ndarray,
    ) -> ProgressBatch:
        return cls(
            node=np.asarray(node, dtype=object),
            ts=np.asarray(ts, dtype=np.float64),
            interval_s=np.asarray(interval_s, dtype=np.float64),
            tokens=np.asarray(tokens, dtype=np.float64),
            token_ms=np.asarray(token_ms, dtype=np.float64),
        )._checked()

    def decode_ms(self) -> np.ndarray:
        """``token_ms / tokens``: the mean time per streamed output token, per row."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.token_ms / self.tokens

    def streams(self) -> np.ndarray:
        """``token_ms / (interval_s * 1000)``: how many requests were decoding, on average."""
        return self.token_ms / (self.interval_s * 1000.0)


def validate_progress(batch: ProgressBatch) -> tuple[np.ndarray, list[tuple[int, RejectReason]]]:
    """Check every progress row, like :func:`validate`: all values finite, none negative, an interval
    longer than 0. Rows with 0 tokens are valid (the node streamed nothing) and carry no signal."""
    with np.errstate(invalid="ignore"):
        finite = (np.isfinite(batch.ts) & np.isfinite(batch.interval_s) & np.isfinite(batch.tokens)
                  & np.isfinite(batch.token_ms))
        negative = (batch.interval_s <= 0) | (batch.tokens < 0) | (batch.token_ms < 0)
        return _first_failing(len(batch), [(~finite, RejectReason.NOT_FINITE), (negative, RejectReason.NEGATIVE)])
