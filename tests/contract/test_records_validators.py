"""The records contract's two spellings of one table cannot drift: the per-record validator
(``contract.normalize.normalize``: HTTP push, log tailing) accepts a record's numbers exactly when the
batch validator (``contract.records.fields_ok``: ``ingest.columns``, ``detector.samples``) accepts
them as a one-row batch. Both read :data:`contract.records.FIELDS`, cross-field rows included."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contract.normalize import RecordError, normalize
from contract.records import FIELDS, MIN_LATENCY_MS, REQUIRED, STATUS, TOKENS, Limits, fields_ok

NOW = 1_800_000_000.0
LIMITS = Limits(max_future_s=300, retention_s=3600, max_latency_ms=60_000, max_prompt_tokens=8192,
                max_completion_tokens=4096)
NUMERIC = [name for name, f in FIELDS.items() if f is not STATUS]

#: Values at and around every bound of the table (the limits above, the latency floor, 0), drawn
#: often so that fields bounded by one another meet on equal values (cached == prompt, ...).
EDGES: list[Any] = [0, 0.0, 1, 2, 2.5, 20, 100, 100.5, 101, 4096, 4097, 8192, 8193, 60_000, 60_000.5,
                    MIN_LATENCY_MS, MIN_LATENCY_MS / 2, -1, -0.5, math.nan, math.inf, -math.inf]
ANY = st.one_of(st.integers(-10, 70_000), st.floats(-10, 70_000), st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """A record's numbers: each absent, an edge, a plausible value, or one of a few values shared
    between the fields (so that a field and the one bounding it are often equal or nearly)."""
    shared = draw(st.lists(st.one_of(st.integers(0, 500), st.floats(0, 500)), min_size=1, max_size=3))
    nearby = shared + [x + d for x in shared for d in (-1, -0.5, 0.5, 1)]
    value = st.one_of(st.none(), st.sampled_from(EDGES), st.sampled_from(nearby), ANY)
    return {name: draw(value) for name in NUMERIC}


def _per_record(numbers: dict[str, Any]) -> bool:
    rec = {"ts": NOW - 1.0, "node": "127.0.0.1:8000", "status": 200,
           **{k: v for k, v in numbers.items() if v is not None}}
    try:
        normalize(rec, now=NOW, **LIMITS.as_kwargs())
    except RecordError as exc:
        # Only a numeric field's rule may refuse (the rest of the record is good).
        assert exc.reason.startswith("bad_") or exc.reason in ("total_below_ttft", "missing_total_ms"), exc
        return False
    return True


def _one_row_batch(numbers: dict[str, Any]) -> bool:
    values = {k: np.array([math.nan if v is None else v], dtype=np.float64) for k, v in numbers.items()}
    given_at = {k: np.array([v is not None]) for k, v in numbers.items()}
    with np.errstate(invalid="ignore"):
        return bool(fields_ok(values, given_at, LIMITS)[0])


# 1,000 examples: each of seven one-rule mutants of the batch validator (needs ignored, the cross-field
# bound dropped, a strict upper or lower bound, zero_ok dropped, the integer rule dropped, a required
# field made optional) fails by the 152nd example of the suite's derandomized sequence (3,000 took 13 s).
@settings(max_examples=1000, deadline=None)
@given(records())
def test_normalize_accepts_a_records_numbers_iff_the_batch_validator_does(numbers: dict[str, Any]) -> None:
    # Both counts 0 is a rule of the record, not of a field (``no_tokens``), refused by both paths
    # outside the table; the test is about the table's rows.
    assume(not all(numbers[name] == 0 for name in TOKENS))
    assert _per_record(numbers) == _one_row_batch(numbers)


def test_a_field_is_read_only_after_every_field_it_names() -> None:
    """The per-record validator reads the table in order, and a bound or a need names a field it has
    read already; a field bounded by another is sure to have it (required, or needed)."""
    seen: set[str] = set()
    for name, f in FIELDS.items():
        assert set(f.needs) <= seen, name
        if f.bounded_by_field:
            assert f.high in seen, name
            assert f.high in REQUIRED or f.high in f.needs, name
        seen.add(name)
