"""The overload cascade (issue 15, item 6: re-tuned on the simulator's vLLM engine).

In ``seed-drill-short-32`` (a busy short-request tier at ~55 % of its prefill capacity) the default
policy ended with 26,682 client timeouts against seed_zscore's 43.5. Three mechanisms, each a
physics mistake, each with its test here:

1. A client's timeout (status 0: it gave up) counted as a server error: two timeouts in 375 requests
   made a healthy node a success-rate outlier of a group with none, and near saturation a node's
   queue reached the client's deadline for several requests in a row (consecutive errors). Each
   ejection moved load onto peers, whose queues then reached the deadline too.
2. Completed requests fed decode one by one, next to the streamed rows that had already counted every
   one of their tokens, uncorrected for the prompt tokens their steps carried; requests that ran on a
   node together shared its steps, so k of them were read as k independent excesses.
3. The decode curve ``c0 + c1 B + c2 W + c3 K`` put the prefill work per decode token ``W`` in on its
   own, where a step pays for the prompt tokens it carries, ``B * W``; and below the healthy range
   (a node cut to the floor weight runs a tiny batch) the fitted line was extrapolated to a near-zero
   step time, so the cut node read many times slower than its peers and was quarantined for the cut.
"""

from __future__ import annotations

import numpy as np
import pytest

from detector.group import GroupDetector
from detector.samples import ProgressBatch, SampleBatch
from detector.states import NodeState, Reason
from detector.thresholds import Thresholds
from harness.fleet import Fleet, run

OUT = {NodeState.QUARANTINED, NodeState.PROBING}


def test_client_cancellations_never_eject_a_node_but_gateway_timeouts_still_do():
    def reasons(status: int) -> set[str]:
        fleet = Fleet(8, seed=31)
        gd = GroupDetector(Thresholds(), fleet.nodes)
        run(gd, fleet, 0, 20)
        got = set()
        for k in range(25):
            gd.ingest(fleet.batch(20 + 0.2 * k, 0.2, status={3: status}))
            ev = gd.evaluate(20.2 + 0.2 * k)
            got |= {t.reason for t in ev.transitions if t.node == fleet.nodes[3] and t.to_state in OUT}
        return got

    assert reasons(0) == set()  # every request of node 3 cancelled by its client: not the node's error
    # The gateway's own upstream timeout (Envoy's local-origin timeout) is still the node's failure.
    assert reasons(504) & {Reason.CONSECUTIVE_ERRORS.value, Reason.SUCCESS_RATE.value}


def test_a_few_cancellations_do_not_make_a_node_a_success_rate_outlier():
    """Two cancelled requests in ~375 while every peer has none: mean - 1.9 stdev of success rates that
    are all 1.0 but one sits just under 1.0, so the old count ejected the node (seed-drill-short-32:
    the first healthy nodes out, 30 s before any fault)."""
    fleet = Fleet(8, seed=32, rate=400)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 6)
    outs = []
    for k in range(60):
        b = fleet.batch(6 + 0.2 * k, 0.2)
        st = b.status.copy()
        mine = np.flatnonzero(b.node == fleet.nodes[2])
        if k in (10, 40) and len(mine):
            st[mine[0]] = 0
        gd.ingest(SampleBatch.from_columns(node=b.node, ts=b.ts, prompt_tokens=b.prompt_tokens,
                                           completion_tokens=b.completion_tokens, ttft_ms=b.ttft_ms,
                                           total_ms=b.total_ms, status=st))
        outs += [t for t in gd.evaluate(6.2 + 0.2 * k).transitions if t.to_state in OUT]
    assert outs == []


def _logs_group(n: int = 8) -> tuple[Fleet, GroupDetector]:
    fleet = Fleet(n, seed=33)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 20)  # access logs only: baselines, fits, per-tick spreads exist
    return fleet, gd


def _requests(node: str, k: int, ts: float, slow: float) -> SampleBatch:
    return SampleBatch.from_columns(node=[node] * k, ts=np.full(k, ts), prompt_tokens=np.full(k, 1000.0),
                                    completion_tokens=np.full(k, 180.0), ttft_ms=np.full(k, 140.0),
                                    total_ms=np.full(k, 140.0 + 179 * 14.0 * slow))


def test_requests_that_ran_together_on_a_node_are_one_observation_per_tick():
    fleet, gd = _logs_group()
    one = GroupDetector.from_bytes(gd.to_bytes())
    node = fleet.nodes[4]
    gd.ingest(_requests(node, 40, 20.1, 1.6))
    one.ingest(_requests(node, 1, 20.1, 1.6))
    a, b = gd.evaluate(20.2), one.evaluate(20.2)
    assert float(a.evidence[4]) > 0
    assert float(a.evidence[4]) == pytest.approx(float(b.evidence[4]), rel=1e-9)
    assert float(a.ema["decode"][4]) == pytest.approx(float(b.ema["decode"][4]), rel=1e-9)
    # ...and how a tick's records are split into ingest calls changes nothing.
    split = GroupDetector.from_bytes(one.to_bytes())
    for d in (one, split):
        d.ingest(_requests(node, 1, 20.3, 1.2))
    split.ingest(_requests(node, 1, 20.35, 2.0))
    one.ingest(_requests(node, 1, 20.35, 2.0))
    assert float(one.evaluate(20.4).evidence[4]) == pytest.approx(float(split.evaluate(20.4).evidence[4]))


def _rows(t: float, b: np.ndarray, w: np.ndarray, k: np.ndarray, slow: np.ndarray) -> ProgressBatch:
    """One 250 ms row per node from a step-time model with the physics of a vLLM step: a fixed cost,
    a cost per sequence, ~0.035 ms per prompt token the step carries (``B * W``), and KV reads."""
    n = len(b)
    step_ms = (12.0 + 0.15 * b + 0.035 * b * w + 30.0 * k) * slow
    tokens = np.round(b * 250.0 / step_ms)
    return ProgressBatch.from_columns(node=[f"n{i}" for i in range(n)], ts=np.full(n, t), interval_s=np.full(n, 0.25),
                                      tokens=tokens, token_ms=tokens * step_ms, running=b.astype(float),
                                      prefill_work=w * tokens, kv_usage=k)


def test_decode_is_compared_at_equal_prompt_tokens_per_step_and_not_extrapolated_below_the_healthy_batch():
    rng = np.random.default_rng(34)
    n = 24
    gd = GroupDetector(Thresholds(), [f"n{i}" for i in range(n)])
    for j in range(80):  # healthy nodes at loads that differ: batch 8-40, 10-300 prompt tokens per token
        b = rng.integers(8, 41, n)
        w = rng.uniform(10, 300, n)
        gd.ingest_progress(_rows(0.25 * (j + 1), b, w, rng.uniform(0.01, 0.2, n), np.ones(n)))
        gd.evaluate(0.25 * (j + 1))
    sig = gd.signals
    assert "p" in sig.load_features
    # Healthy nodes at any load inside the healthy range read alike once compared at equal load.
    b, w = rng.integers(8, 41, 200), rng.uniform(10, 300, 200)
    rows = _rows(30.0, b, w, rng.uniform(0.01, 0.2, 200), np.ones(200))
    eq = sig.per_row(rows)["decode"]
    assert float(np.std(np.log(eq))) < 0.05  # with W alone in the curve: 0.30
    # A 3x slow node reads 3x at any load.
    slow = sig.per_row(_rows(30.0, b, w, rng.uniform(0.01, 0.2, 200), np.full(200, 3.0)))["decode"]
    assert float(np.median(slow / eq)) == pytest.approx(3.0, rel=0.02)
    # A healthy node cut to the floor weight (batch 1, less than any healthy node ran) does not look
    # slow: below the range the curve is held at its edge, never extrapolated toward zero.
    cut = sig.per_row(_rows(30.0, np.array([1, 2]), np.array([150.0, 150.0]), np.array([0.05, 0.05]),
                            np.ones(2)))["decode"]
    assert np.all(cut <= float(np.median(eq)) * 1.05)
