import math

import numpy as np

from detector.samples import (
    RejectReason,
    SampleBatch,
    classify_status,
    decode_per_token,
    prefill_per_token,
    seed_norm,
    validate,
)


def test_every_invalid_sample_gets_a_reason():
    b = SampleBatch.from_records(
        [
            {"node": "a", "ts": 1, "prompt_tokens": 100, "completion_tokens": 10, "ttft_ms": 50, "total_ms": 200},
            {"node": "a", "ts": 1, "prompt_tokens": 100, "completion_tokens": 10, "ttft_ms": 50, "total_ms": math.nan},
            {"node": "a", "ts": 1, "prompt_tokens": -1, "completion_tokens": 10, "ttft_ms": 50, "total_ms": 200},
            {"node": "a", "ts": 1, "prompt_tokens": 100, "completion_tokens": 10, "ttft_ms": 300, "total_ms": 200},
            {"node": "a", "ts": 1, "prompt_tokens": 0, "completion_tokens": 0, "ttft_ms": 5, "total_ms": 10},
            {"node": "a", "ts": 1, "prompt_tokens": 1, "completion_tokens": 1, "total_ms": 10, "status": 999},
            {"node": "a", "ts": 1, "prompt_tokens": 1, "completion_tokens": 1, "total_ms": 10, "ttft_ms": None},
        ]
    )
    ok, rejected = validate(b)
    assert ok.tolist() == [True, False, False, False, False, False, True]
    assert rejected == [
        (1, RejectReason.NOT_FINITE),
        (2, RejectReason.NEGATIVE),
        (3, RejectReason.TOTAL_BELOW_TTFT),
        (4, RejectReason.NO_TOKENS),
        (5, RejectReason.BAD_STATUS),
    ]


def test_signal_formulas():
    b = SampleBatch.from_columns(
        node=["a", "a"], ts=[0, 0], prompt_tokens=[1000, 0], completion_tokens=[101, 1],
        ttft_ms=[120.0, 30.0], total_ms=[1520.0, 30.0],
    )
    assert seed_norm(b, 0.25)[0] == 1520.0 / (1000 * 0.25 + 101)
    assert prefill_per_token(b).tolist() == [0.12, 30.0]
    assert decode_per_token(b)[0] == (1520.0 - 120.0) / 100
    assert np.isnan(decode_per_token(b)[1])  # one token: no inter-token time


def test_status_semantics():
    latency, error = classify_status(np.array([200, 302, 0, 504, 408, 503, 500, 429, 404]))
    assert latency.tolist() == [True, True, True, True, True, False, False, False, False]
    # A client's cancellation (0: it gave up) is latency, not an error; the 408/504 a server or the
    # gateway produced are both.
    assert error.tolist() == [False, False, False, True, True, True, True, False, False]


def test_columns_of_unequal_length_are_refused_naming_the_batch():
    import pytest

    from detector.samples import ProgressBatch

    with pytest.raises(ValueError, match="SampleBatch columns must all have the same length"):
        SampleBatch.from_columns(node=["a", "b"], ts=[1.0], prompt_tokens=[1, 2], completion_tokens=[1, 2],
                                 total_ms=[5.0, 6.0])
    with pytest.raises(ValueError, match="ProgressBatch columns must all have the same length"):
        ProgressBatch.from_columns(node=["a"], ts=[1.0], interval_s=[1.0, 1.0], tokens=[5], token_ms=[70.0])
    rows = ProgressBatch.from_columns(node=["a", "b"], ts=[1.0, 2.0], interval_s=[1.0, 1.0], tokens=[5, 6],
                                      token_ms=[70.0, 84.0])
    assert rows.take(np.array([False, True])).node.tolist() == ["b"] and len(rows) == 2
