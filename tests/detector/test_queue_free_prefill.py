"""The queue-free signals beyond decode: prefill time from the model server (or TTFT minus queue time),
prefix-cache hits, decode compared at equal batch, and latency-only records."""

from __future__ import annotations

import io

import numpy as np
import pytest

from detector.group import GroupDetector
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

TICK = 0.2
CUT = {NodeState.DEGRADED, NodeState.PENDING_APPROVAL, NodeState.QUARANTINED, NodeState.PROBING}
OUT = {NodeState.QUARANTINED, NodeState.PROBING}


def drive(gd: GroupDetector, fleet: Fleet, t0: float, seconds: float, *, records: bool = True,
          rows: bool = True, **kw) -> list:
    evs, t = [], t0
    for _ in range(round(seconds / TICK)):
        if records:
            gd.ingest(fleet.batch(t, TICK))
        t += TICK
        if rows:
            gd.ingest_progress(fleet.progress(t, TICK, **kw))
        evs.append(gd.evaluate(t))
    return evs


def first(evs, i: int, states) -> float | None:
    return next((ev.at for ev in evs if ev.states[i] in states), None)


def moved(evs) -> set[str]:
    return {t.node for ev in evs for t in ev.transitions}


def test_a_fault_that_slows_only_prefill_is_cut_from_the_model_servers_histogram():
    """Finding: with TTFT logged every latency verdict was gated on decode, so a node whose prefill is
    5x slower and decode unchanged was never acted on. The model server's prefill histogram is
    queue-free: it decides next to decode. It cuts the node's weight (to the floor at this Z); it
    does not quarantine on its own, since under chunked prefill it also grows with load."""
    fleet = Fleet(20, seed=21)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    healthy = drive(gd, fleet, 0, 60, prefill=True)
    fleet.prefill_slow[6] = 5.0
    evs = drive(gd, fleet, 60, 30, prefill=True)
    assert moved(healthy) == set()
    assert first(evs, 6, CUT) - 60 <= 3.0
    assert first(evs, 6, OUT) is None
    assert moved(evs) == {fleet.nodes[6]}
    cut = next(t for ev in evs for t in ev.transitions if t.to_state == NodeState.DEGRADED)
    assert cut.signal == "prefill_time" and cut.z > Thresholds().quarantine_z
    assert evs[-1].weights[6] == pytest.approx(5.0)  # the floor: min_weight_fraction * base


@pytest.mark.parametrize(("slowdown", "cut"), [(1.3, False), (2.0, True)])
def test_a_sustained_prefill_slowdown_is_cut_over_its_own_line(slowdown, cut):
    """Prefill time alone cuts a node over ``prefill_materiality`` (1.5x), not at decode's 1.15x: a
    healthy node's prefill time moves with its load under chunked prefill."""
    fleet = Fleet(20, seed=22)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60, prefill=True)
    fleet.prefill_slow[3] = slowdown
    evs = drive(gd, fleet, 60, 30, prefill=True)
    assert (first(evs, 3, {NodeState.DEGRADED}) is not None) is cut
    assert moved(evs) == ({fleet.nodes[3]} if cut else set())


def test_ttft_minus_the_logged_queue_time_is_queue_free_too():
    # A gateway that logs the engine's queue time next to TTFT: no model-server scrape needed.
    fleet = Fleet(20, seed=23)
    fleet.logs_queue = True
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60, rows=False)
    fleet.prefill_slow[9] = 5.0
    evs = drive(gd, fleet, 60, 40, rows=False)
    assert first(evs, 9, CUT) is not None
    assert moved(evs) == {fleet.nodes[9]}


def test_a_queue_alone_cuts_nobody_when_the_prefill_it_delays_is_normal():
    # The queue cascade the design avoids: a node whose queue adds 3 s to every TTFT but whose GPU
    # prefills and decodes like its peers is not the node to cut.
    fleet = Fleet(20, seed=24)
    fleet.logs_queue = True
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 60, prefill=True)
    fleet.wait_ms[4] = 3000.0
    evs = drive(gd, fleet, 60, 30, prefill=True)
    assert moved(evs) == set()
    assert evs[-1].z_by_signal["prefill"][4] > 10  # the queue-laden TTFT saw it, and does not decide


def test_prefix_cache_hits_do_not_make_a_node_look_fast_or_its_peers_slow():
    fleet = Fleet(20, seed=25)
    for i in range(10):
        fleet.cache_hit[i] = 0.8  # half the group serves most prompt tokens from its cache
    gd = GroupDetector(Thresholds(), fleet.nodes)
    evs = drive(gd, fleet, 0, 90, prefill=True)
    assert moved(evs) == set()
    z = evs[-1].z_by_signal["prefill_time"]
    assert np.nanmax(np.abs(z)) < Thresholds().degrade_z


def busy(n: int) -> dict[int, int]:
    """Healthy nodes mostly at batch 20, a few at 44-52 (they drew the long requests)."""
    out = {i: 18 + (i % 5) for i in range(n)}
    out.update({0: 44, 1: 48, 2: 52})
    return out


def test_decode_is_compared_at_equal_batch_where_the_server_reports_it():
    """A busier healthy node decodes each token slower (every stream shares a longer step). Compared
    at the group's median batch it is not slower; without the curve the busiest nodes are cut."""
    def cut_nodes(curve: bool) -> set[str]:
        fleet = Fleet(16, seed=26)
        gd = GroupDetector(Thresholds(decode_batch_curve=curve), fleet.nodes)
        evs = drive(gd, fleet, 0, 120, records=False, streams=busy(16), per_stream=0.02, running=True)
        return moved(evs)

    assert cut_nodes(curve=True) == set()
    assert len(cut_nodes(curve=False)) >= 2


def test_with_the_batch_curve_a_slow_node_is_still_cut_and_a_surge_cuts_nobody():
    fleet = Fleet(16, seed=27)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    streams = busy(16)
    drive(gd, fleet, 0, 60, records=False, streams=streams, per_stream=0.02, running=True)
    # Every node's batch doubles at once (a traffic surge): load, not slowness.
    surge = {i: 2 * k for i, k in streams.items()}
    evs = drive(gd, fleet, 60, 30, records=False, streams=surge, per_stream=0.02, running=True)
    assert moved(evs) == set()
    # A 1.3x slow node at a middle batch, whose batch grows as its requests stay longer.
    fleet.slow[8] = 1.3
    slow_streams = {**streams, 8: round(streams[8] * 1.3)}
    evs = drive(gd, fleet, 90, 30, records=False, streams=slow_streams, per_stream=0.02, running=True)
    assert first(evs, 8, {NodeState.DEGRADED}) is not None
    assert moved(evs) == {fleet.nodes[8]}


def test_latency_only_records_are_judged_against_peers():
    # A log format without token counts (nginx combined): latency over the group's typical latency.
    fleet = Fleet(16, seed=28)
    fleet.logs_tokens = False
    fleet.logs_ttft = False
    gd = GroupDetector(Thresholds(), fleet.nodes)
    healthy = drive(gd, fleet, 0, 60, rows=False)
    assert moved(healthy) == set()
    assert gd.ewma["norm"].count.min() > 0
    fleet.slow[5] = 3.0
    evs = drive(gd, fleet, 60, 60, rows=False)
    assert first(evs, 5, CUT) is not None
    assert moved(evs) == {fleet.nodes[5]}


def test_new_columns_survive_a_snapshot_and_an_older_snapshot_still_restores():
    fleet = Fleet(8, seed=29)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 30, prefill=True, running=True, streams=busy(8), per_stream=0.02)
    copy = GroupDetector.from_bytes(gd.to_bytes())
    assert copy.signals.fit_prefill_time is not None and copy.signals.fit_batch is not None
    rows = fleet.progress(30.2, TICK, prefill=True, running=True)
    for d in (gd, copy):
        d.ingest_progress(rows)
    for s in ("prefill_time", "decode"):
        np.testing.assert_array_equal(copy.ewma[s].mean, gd.ewma[s].mean)
    np.testing.assert_array_equal(copy.a.evidence_prefill, gd.a.evidence_prefill)
    np.testing.assert_array_equal(copy.a.running, gd.a.running)

    # A snapshot written before these existed: strip them and it restores with them empty.
    import json

    # Written before packing too (snapshot version 1): every array under its own name.
    from detector import snapshot

    with np.load(io.BytesIO(gd.to_bytes())) as z:
        current = {k: z[k] for k in z.files}
    meta = json.loads(current["meta"].tobytes().decode())
    unpacked = snapshot.unpack(current, meta.pop("packed", {}))
    arrays = {k: v for k, v in unpacked.items() if not k.startswith(("e.prefill_time.", "q.", "fit.prefill_time",
                                                                      "fit.batch", "a.evidence_prefill",
                                                                      "a.running"))}
    meta["version"] = 1
    for k in ("engine_pos", "engine_filled", "typical_ms", "load_features", "load_ref"):
        meta.pop(k)
    meta["fits"] = {k: v for k, v in meta["fits"].items() if k in ("norm", "prefill")}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    old = GroupDetector.from_bytes(buf.getvalue())
    assert old.ewma["prefill_time"].count.tolist() == [0] * 8
    assert np.isnan(old.a.running).all() and old.signals.fit_batch is None
    np.testing.assert_array_equal(old.ewma["decode"].mean, gd.ewma["decode"].mean)
    old.ingest_progress(fleet.progress(30.4, TICK, prefill=True))
    old.evaluate(30.4)


@pytest.mark.parametrize("bad", [np.inf, -1.0])
def test_a_row_with_a_bad_optional_column_is_refused(bad):
    from detector.samples import ProgressBatch, RejectReason

    gd = GroupDetector(Thresholds(), ["a"])
    res = gd.ingest_progress(ProgressBatch.from_columns(
        node=["a"], ts=[1.0], interval_s=[0.2], tokens=[10], token_ms=[140], prefills=[1], prefill_ms=[bad],
        prefill_tokens=[100]))
    assert res.accepted == 0
    assert res.rejected[0][1] in (RejectReason.NOT_FINITE, RejectReason.NEGATIVE)
