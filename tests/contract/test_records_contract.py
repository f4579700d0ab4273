"""The records contract (:mod:`contract.records`) is one table, and its three readers enforce every
bound of it alike: ``records.normalize`` (one record), ``columns.normalize_many`` (a batch, through
its numpy screen) and ``detector.samples.validate`` (the detector's batch, given the same limits).
Each row below is one value just past a bound (refused by all three) or at it (accepted by all three)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from contract.normalize import RecordError, normalize
from contract.records import FIELDS, HTTP_STATUS, MIN_LATENCY_MS, Limits
from detector.samples import SampleBatch, validate
from outlier_admin.ingest.columns import normalize_many

NOW = 1_800_000_000.0
LIMITS = Limits(max_future_s=300, retention_s=3600, max_latency_ms=60_000, max_prompt_tokens=8192,
                max_completion_tokens=4096)
GOOD = {"ts": NOW - 1.0, "node": "127.0.0.1:8000", "prompt_tokens": 100, "completion_tokens": 50,
        "cached_tokens": 20, "ttft_ms": 200.0, "queue_ms": 50.0, "total_ms": 1000.0, "status": 200}

BAD: list[tuple[str, Any]] = [
    ("prompt_tokens", -1), ("prompt_tokens", 8193), ("prompt_tokens", 5.5),
    ("completion_tokens", -1), ("completion_tokens", 4097), ("completion_tokens", 0.5),
    ("cached_tokens", -1), ("cached_tokens", 101), ("cached_tokens", 2.5),
    ("total_ms", MIN_LATENCY_MS / 2), ("total_ms", 60_000.5), ("total_ms", -1.0), ("total_ms", math.inf),
    ("total_ms", math.nan),
    ("ttft_ms", MIN_LATENCY_MS / 2), ("ttft_ms", 1000.5), ("ttft_ms", -1.0), ("ttft_ms", math.inf),
    ("queue_ms", MIN_LATENCY_MS / 2), ("queue_ms", 200.5), ("queue_ms", -1.0),
    ("status", HTTP_STATUS[0] - 1), ("status", HTTP_STATUS[1] + 1), ("status", -1),
    ("ts", math.nan), ("ts", math.inf),
]
AT_BOUND: list[tuple[str, Any]] = [
    ("prompt_tokens", 8192), ("prompt_tokens", 20), ("completion_tokens", 4096), ("completion_tokens", 0),
    ("cached_tokens", 100), ("cached_tokens", 0),
    ("total_ms", 60_000.0), ("ttft_ms", 0.0), ("ttft_ms", MIN_LATENCY_MS), ("ttft_ms", 1000.0),
    ("queue_ms", 0.0), ("queue_ms", MIN_LATENCY_MS), ("queue_ms", 200.0),
    ("status", 0), ("status", HTTP_STATUS[0]), ("status", HTTP_STATUS[1]),
]


def _verdicts(rec: dict[str, Any]) -> tuple[bool, bool, bool, bool]:
    """Accepted? by normalize, by normalize_many alone (the per-record path), by normalize_many's
    screen (in a batch of 20 good records) and by the detector's validate."""
    try:
        normalize(rec, now=NOW, **LIMITS.as_kwargs())
        one = True
    except RecordError:
        one = False
    alone = not isinstance(normalize_many([rec], now=NOW, **LIMITS.as_kwargs())[0], RecordError)
    batch = normalize_many([rec] + [dict(GOOD)] * 19, now=NOW, **LIMITS.as_kwargs())
    assert not any(isinstance(r, RecordError) for r in batch[1:])
    screened = not isinstance(batch[0], RecordError)
    valid, _ = validate(SampleBatch.from_records([rec]), LIMITS)
    return one, alone, screened, bool(valid[0])


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_a_value_past_a_bound_is_refused_by_all_three(field: str, value: Any) -> None:
    assert _verdicts({**GOOD, field: value}) == (False, False, False, False)


@pytest.mark.parametrize(("field", "value"), AT_BOUND, ids=[f"{f}={v!r}" for f, v in AT_BOUND])
def test_a_value_at_a_bound_is_accepted_by_all_three(field: str, value: Any) -> None:
    rec = {**GOOD, field: value}
    if field == "ttft_ms":
        rec["queue_ms"] = min(value, GOOD["queue_ms"])  # the queue wait is a part of TTFT
    assert _verdicts(rec) == (True, True, True, True)


def test_no_tokens_and_the_latency_only_record_alike() -> None:
    assert _verdicts({**GOOD, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": None}) == (
        False, False, False, False)
    latency_only = {k: v for k, v in GOOD.items() if k not in ("prompt_tokens", "completion_tokens")}
    assert _verdicts(latency_only) == (True, True, True, True)


def test_every_numeric_bound_of_the_table_is_exercised() -> None:
    """A bound added to the table must get its row here: every field has a refused value."""
    assert {f for f, _ in BAD} >= set(FIELDS)
