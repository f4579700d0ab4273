"""``records.normalize_many`` (the batch screen HTTP push goes through) gives, record by record, exactly
what ``records.normalize`` (the one definition of the rules) gives: the same canonical values of the
same types, or the same refusal with the same reason and detail — for valid and adversarial records."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contract.normalize import RecordError, normalize
from outlier_admin.ingest.columns import canonical, normalize_many

NOW = 1_800_000_000.0
BOUNDS = {"max_future_s": 300, "retention_s": 3600, "max_latency_ms": 3_600_000,
          "max_prompt_tokens": 10_000_000, "max_completion_tokens": 1_000_000}
BATCH = 20  # at least records._SCREEN_MIN: the screen runs, not the per-record path

ODD = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.just(2**53 + 1) | st.just(10**400)
       | st.floats(allow_nan=True, allow_infinity=True) | st.just(-0.0) | st.text(max_size=8)
       | st.sampled_from(["12", " 7 ", "1e3", "NaN", "inf", "-1", "2026-01-31T12:00:00Z", "4.5"])
       | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
NAMES = st.sampled_from(["127.0.0.1:8000", " 127.0.0.1:8001 ", "gpu-node-07", "http://127.0.0.1:8000/v1",
                         "a\x00b", "n" * 201, "", "meta-llama/Llama-3.1-70B-Instruct@h100", "g/../x", "[fd00::5]:80"])


FIELDS = ("ts", "node", "group", "prompt_tokens", "completion_tokens", "cached_tokens", "total_ms", "ttft_ms",
          "queue_ms", "request_id", "status")
#: Values at and past each bound (the screen's comparisons must match normalize's at the edge).
EDGES = {
    "ts": [NOW + 300, NOW + 300.001, NOW - 3600, NOW - 3600.001, int(NOW), "1800000000", math.nan],
    "prompt_tokens": [0, 10_000_000, 10_000_001, 5.0, 5.5, -1, -0.0, 2**53, 2**53 + 1],
    "completion_tokens": [0, 1_000_000, 1_000_001, 1e6, 0.5, -1],
    "cached_tokens": [0, 10**7 + 1, 3.0, 2.5, -1],
    "total_ms": [0, -0.0, 0.0001, 0.001, 0.000999, 1e-300, 5e-324, 3_600_000, 3_600_000.5, 1, math.inf],
    "ttft_ms": [0, -0.0, 3_600_000, 3_600_001, 0.5, 0.001, 0.000999, 1e-300],
    "queue_ms": [0, -0.0, 1e9, 0.25, 0.001, 1e-300],
    "status": [0, 99, 100, 599, 600, -1, True, "200", 2**64],
    "request_id": ["", "r" * 200, "r" * 201, "a\x00", "é"],
}


@st.composite
def records(draw: st.DrawFn) -> Any:
    """A valid record, then 0-2 of its fields removed, nulled, or set to an edge value or anything."""
    if draw(st.integers(0, 30)) == 0:
        return draw(ODD)  # not an object
    total = draw(st.floats(0.001, 3_600_000.0) | st.integers(1, 3_600_000))
    ttft = draw(st.floats(0, total) | st.integers(0, int(total)))
    prompt = draw(st.integers(0, 10_000_000) | st.floats(0, 1e7).map(math.floor).map(float))
    rec: dict[str, Any] = {
        "ts": draw(st.floats(NOW - 3600, NOW + 300) | st.integers(int(NOW) - 3600, int(NOW) + 300)),
        "node": draw(st.sampled_from(["127.0.0.1:8000", " 127.0.0.1:8001 ", "gpu-node-07", "[fd00::5]:80"])),
        "group": draw(st.sampled_from(["g1", " g2 ", "meta-llama/Llama-3.1-70B-Instruct@h100"])),
        "prompt_tokens": prompt,
        "completion_tokens": draw(st.integers(1, 1_000_000)),
        "cached_tokens": draw(st.integers(0, int(prompt))),
        "total_ms": total,
        "ttft_ms": ttft,
        "queue_ms": draw(st.floats(0, ttft) | st.integers(0, int(ttft))),
        "request_id": draw(st.text("abc-0123", max_size=5)),
        "status": draw(st.sampled_from([0, 100, 200, 404, 503, 599])),
    }
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2, unique=True)):
        how = draw(st.sampled_from(["absent", "null", "edge", "edge", "any"]))
        if how == "absent":
            rec.pop(name)
        elif how == "null":
            rec[name] = None  # null is not absent for status (refused, where absent is 200)
        elif how == "edge" and name in EDGES:
            rec[name] = draw(st.sampled_from(EDGES[name]))
        elif name in ("node", "group"):
            rec[name] = draw(NAMES | ODD)
        else:
            rec[name] = draw(ODD)
    return rec


def _expected(rec: Any) -> Any:
    try:
        return canonical(normalize(rec, now=NOW, **BOUNDS))
    except RecordError as exc:
        return exc


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, RecordError):
        return isinstance(got, RecordError) and (got.reason, got.detail) == (want.reason, want.detail)
    return (isinstance(got, tuple) and got == want
            and [type(v) for v in got] == [type(v) for v in want]
            and all(math.copysign(1, a) == math.copysign(1, b) for a, b in zip(got, want, strict=True)
                    if isinstance(a, float)))


@hsettings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(records(), min_size=BATCH, max_size=BATCH + 10))
def test_the_batch_screen_agrees_with_normalize_on_every_record(batch: list[Any]) -> None:
    got = normalize_many(batch, now=NOW, **BOUNDS)
    assert len(got) == len(batch)
    for rec, out in zip(batch, got, strict=True):
        want = _expected(rec)
        assert _same(out, want), (rec, out, want)


def test_a_batch_of_ordinary_records_is_accepted_with_normalizes_values() -> None:
    batch = [{"ts": NOW - i, "node": f"127.0.0.1:{8000 + i % 3}", "group": "g1", "prompt_tokens": 100 + i,
              "completion_tokens": 20, "ttft_ms": 100, "total_ms": 900.5, "status": 200, "request_id": f"r{i}"}
             for i in range(40)]
    batch[5]["ts"] = "2027-02-01T00:00:00Z"  # RFC 3339: normalize's path; two weeks ahead
    batch[6].pop("status")
    got = normalize_many(batch, now=NOW, **BOUNDS)
    assert [_same(g, _expected(r)) for g, r in zip(got, batch, strict=True)] == [True] * 40
    assert isinstance(got[5], RecordError) and got[5].reason == "ts_in_future"
    assert got[0] == ("127.0.0.1:8000", NOW, 100, 20, 100.0, 900.5, 200, None, None, "g1", "r0")
    assert got[6][6] == 200
