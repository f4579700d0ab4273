"""Streamed decode progress (``GroupDetector.ingest_progress``): validation, the decode signal it feeds,
how fast it sees a fault that completed requests report seconds late, and what it does not react to."""

from __future__ import annotations

import numpy as np
import pytest

from detector.group import GroupDetector
from detector.samples import ProgressBatch, RejectReason
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

TICK = 0.2


def drive(gd: GroupDetector, fleet: Fleet, t0: float, seconds: float, *, stall=None, records: bool = True, **kw):
    """Per tick: the completed requests (access log), the streamed progress, then one evaluation."""
    evs = []
    t = t0
    for _ in range(round(seconds / TICK)):
        if records:
            gd.ingest(fleet.batch(t, TICK))
        t += TICK
        gd.ingest_progress(fleet.progress(t, TICK, stall=stall(t) if stall else None, **kw))
        evs.append(gd.evaluate(t))
    return evs


def first(evs, i: int, states) -> float | None:
    return next((ev.at for ev in evs if ev.states[i] in states), None)


def test_bad_rows_are_refused_with_a_reason_and_empty_ones_ignored():
    gd = GroupDetector(Thresholds(), ["a", "b"])
    res = gd.ingest_progress(ProgressBatch.from_columns(
        node=["a", "a", "b", "b", "zz", "a"], ts=[1, np.nan, 1, 1, 1, 1], interval_s=[1, 1, 0, 1, 1, 1],
        tokens=[50, 50, 50, -3, 50, 0], token_ms=[700, 700, 700, 700, 700, 0]))
    assert res.accepted == 1
    assert res.rejected == [(1, RejectReason.NOT_FINITE), (2, RejectReason.NEGATIVE), (3, RejectReason.NEGATIVE),
                            (4, RejectReason.UNKNOWN_NODE)]
    assert res.unknown_nodes == ["zz"]
    assert res.ignored == 1
    assert gd.rejected_total == {"not_finite": 1, "negative": 2}
    assert gd.ewma["decode"].count.tolist() == [1, 0]
    assert gd.ewma["decode"].mean[0] == pytest.approx(14.0)  # 700 ms of gaps over 50 tokens


def test_streaming_sees_a_throttled_node_within_a_second_and_quarantines_it_on_time_persistence():
    fleet = Fleet(32, seed=3)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    healthy = drive(gd, fleet, 0, 60)
    fleet.slow[5] = 2.0  # every token of node 5 now takes twice as long, its running requests included
    # The stream alone (multi-second requests: none that completes in the first seconds is fully slowed).
    evs = drive(gd, fleet, 60, 30, records=False)
    assert all(ev.transitions == [] for ev in healthy)
    degraded = first(evs, 5, {NodeState.DEGRADED, NodeState.QUARANTINED}) - 60
    quarantined = first(evs, 5, {NodeState.QUARANTINED, NodeState.PROBING}) - 60
    assert degraded <= 1.0
    # Persistence is time: quarantine_persistence_s (1 s) of rows at quarantine strength after the EMA
    # got there (a 2x node's EMA reaches 1.5x in 5 rows), however many streams each row holds. (It
    # was 10 rows, 2 s at 200 ms rows, 2.5 s at the production's 250 ms, 10 s at 1 s.)
    persistence = gd.thresholds.quarantine_persistence_s
    assert persistence - 1e-9 <= quarantined <= persistence + 1.2
    assert degraded >= 3 * TICK - 1e-9
    assert {t.node for ev in evs for t in ev.transitions} == {fleet.nodes[5]}


def test_a_sustained_thirty_percent_slowdown_is_cut_from_the_stream_alone():
    fleet = Fleet(32, seed=8)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60, records=False)
    fleet.slow[9] = 1.3
    evs = drive(gd, fleet, 60, 20, records=False)
    cut = first(evs, 9, {NodeState.DEGRADED})
    assert cut is not None and cut - 60 <= 5.0
    assert {t.node for ev in evs for t in ev.transitions} == {fleet.nodes[9]}


def test_many_streams_in_one_row_are_one_observation_not_many():
    """Finding: a row of k streams counted k samples toward persistence and its evidence unit was the
    per-request spread / sqrt(k), so a node-wide stall of a busy node read as overwhelming evidence.
    A node decoding 200 streams and one decoding 20 now need the same number of rows."""
    def rows_to_quarantine(streams: int) -> int:
        fleet = Fleet(16, seed=12)
        gd = GroupDetector(Thresholds(), fleet.nodes)
        busy = {i: streams for i in range(16)}
        drive(gd, fleet, 0, 30, records=False, streams=busy)
        fleet.slow[4] = 3.0
        evs = drive(gd, fleet, 30, 20, records=False, streams=busy)
        return round((first(evs, 4, {NodeState.QUARANTINED, NodeState.PROBING}) - 30) / TICK)

    assert rows_to_quarantine(200) == rows_to_quarantine(20) >= Thresholds().quarantine_persistence_s / TICK


def test_a_short_stall_of_every_stream_cuts_nobody():
    # A long prompt's prefill or a host hiccup stalls every stream of a node at once, for a moment.
    fleet = Fleet(32, seed=4)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60)
    evs = drive(gd, fleet, 60, 30, stall=lambda t: {7: 2.5} if 60 < t <= 60.4 + 1e-9 else None)
    assert all(ev.transitions == [] for ev in evs)
    assert max(float(ev.evidence[7]) for ev in evs) > 0  # it was seen, and not enough


def test_a_streamed_node_is_judged_on_its_rows_and_its_requests_pool_into_one_observation_per_250_ms():
    """Finding (seed-drill-short-32, access logs at 37 requests/s per node): a completed request's
    decode was one EMA and evidence sample each, next to the rows that had already counted every one
    of its tokens, uncorrected for the prefill work its steps carried; requests that ran together
    shared their steps, so k of them read as k independent excesses and healthy nodes were cut 176
    times in 150 s. Now a node whose /metrics is read is judged on its rows alone, and a node without
    rows gets one observation per tick: the geometric mean of its requests."""
    fleet = Fleet(8, seed=5)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 10, records=False)
    # One sample per node and row, whatever the number of streams in it.
    assert gd.ewma["decode"].count.tolist() == [10 / TICK] * 8
    before = gd.ewma["decode"].count.copy()
    gd.ingest(fleet.batch(10, 1.0))
    gd.evaluate(11.0)
    # Their completed requests add nothing to decode: the rows measured those tokens already.
    assert gd.ewma["decode"].count.tolist() == before.tolist()
    # A group without rows: every node's requests of a tick are one observation, however many, which
    # the EMA takes once per 250 ms the tick covers (POOL_OBSERVATION_S: a row's worth of time).
    logs = GroupDetector(Thresholds(), fleet.nodes)
    for k in range(5):
        batch = fleet.batch(10 + k, 1.0)
        logs.ingest(batch)
        logs.evaluate(11.0 + k)
    assert logs.ewma["decode"].count.tolist() == [1 + 4 * 4] * 8  # the first tick: one; then 1 s each
    assert len(batch) > 40  # (not for want of requests: 180 per second over 8 nodes)
    # The same second at 250 ms ticks moves the EMA as far: a speed in seconds, not in ticks.
    fast = GroupDetector(Thresholds(), fleet.nodes)
    for k in range(17):
        fast.ingest(fleet.batch(10 + k / 4, 0.25))
        fast.evaluate(11.0 + k / 4)
    assert fast.ewma["decode"].count.tolist() == [17] * 8


def test_without_ttft_in_the_log_the_stream_gives_a_queue_free_decision_signal():
    fleet = Fleet(16, seed=6)
    fleet.logs_ttft = False
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60)
    fleet.slow[2] = 2.0
    evs = drive(gd, fleet, 60, 30)
    assert evs[-1].decision_signal == "decode"
    # No wait for the queue to drain (queue_drain_s, 10 s): the stream is measured after the queue.
    # (A 2x node's EMA reaches the quarantine line in 5 rows, then 1 s of persistence.)
    assert first(evs, 2, {NodeState.QUARANTINED, NodeState.PROBING}) - 60 <= 2.4


def test_progress_state_survives_a_snapshot():
    fleet = Fleet(8, seed=7)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 5)
    copy = GroupDetector.from_bytes(gd.to_bytes())
    rows = fleet.progress(5.2, TICK)
    for d in (gd, copy):
        d.ingest_progress(rows)
    np.testing.assert_array_equal(copy.ewma["decode"].mean, gd.ewma["decode"].mean)
    np.testing.assert_array_equal(copy.a.evidence, gd.a.evidence)
    np.testing.assert_array_equal(copy.a.new_samples, gd.a.new_samples)
