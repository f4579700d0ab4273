"""In-flight streams that make no progress are censored samples (``detector.inflight``): the batch form
against a row-by-row reference, and what a group does with a node that stops decoding."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.group import GroupDetector
from detector.inflight import CONTINUITY_INTERVALS, stall_bounds, stalled_rows
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

TICK = 0.25  # the production scrape period


def reference(rows, stall_from, rows_at):
    """One row at a time, as the module docstring states the rule."""
    stall_from, rows_at = dict(stall_from), dict(rows_at)
    out = []
    decoding_before: dict[int, bool] = {}
    for node, ts, interval, tokens, token_ms, running in rows:
        if node not in decoding_before:  # the node's first row of the batch: the carried state
            decoding_before[node] = (math.isfinite(stall_from[node])
                                     or rows_at[node] >= ts - interval * (1 + CONTINUITY_INTERVALS))
        counted = tokens == 0 and token_ms > 0
        waiting = tokens == 0 and not counted and running > 0
        stalled = counted or (waiting and decoding_before[node])
        if stalled:
            if not math.isfinite(stall_from[node]):
                stall_from[node] = ts - interval
            out.append((ts - stall_from[node]) * 1000.0)
        else:
            stall_from[node] = math.nan
            out.append(math.nan)
        decoding_before[node] = tokens > 0 or stalled
    return out, stall_from


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 0, 0, 3]), st.sampled_from([0.0, 250.0]),
                          st.sampled_from([0.0, 1.0, math.nan])), min_size=1, max_size=30),
       st.lists(st.sampled_from([math.nan, 0.5]), min_size=3, max_size=3),
       st.lists(st.sampled_from([math.nan, -10.0, 0.9]), min_size=3, max_size=3))
def test_the_batch_form_equals_one_row_at_a_time(raw, carried_from, carried_rows_at):
    raw = sorted(raw, key=lambda r: r[0])  # grouped by node; list order is time order within a node
    seen: dict[int, int] = {}
    rows = []
    for node, tokens, token_ms, running in raw:
        k = seen[node] = seen.get(node, 0) + 1
        rows.append((node, 1.0 + 0.25 * k, 0.25, float(tokens), token_ms, running))
    stall_from = np.array(carried_from, dtype=float)
    rows_at = np.array(carried_rows_at, dtype=float)
    cols = [np.array(c) for c in zip(*rows, strict=True)]
    node = cols[0].astype(np.int64)
    stalled = stalled_rows(node, cols[1], cols[2], cols[3], cols[4], cols[5], stall_from, rows_at)
    bound, after = stall_bounds(node, cols[1], cols[2], stalled, stall_from)
    want, want_after = reference(rows, dict(enumerate(stall_from)), dict(enumerate(rows_at)))
    np.testing.assert_allclose(bound, want, equal_nan=True)
    for i in set(node.tolist()):
        assert (math.isnan(after[i]) and math.isnan(want_after[i])) or after[i] == want_after[i]


def drive(gd, fleet, t0, seconds, *, stop=None, style="slots", idle=None):
    """Progress rows every 250 ms; nodes in ``stop`` (from ``stop[i]`` on) decode no token. ``style``:
    what the source reports for them: llama.cpp's /slots counts the stalled streams (``token_ms > 0``),
    an inter-token histogram (vLLM) only its running gauge."""
    evs, t = [], t0
    for _ in range(round(seconds / TICK)):
        t += TICK
        b = fleet.progress(t, TICK, running=True)
        tokens, token_ms, running = b.tokens.copy(), b.token_ms.copy(), b.running.copy()
        for i, since in (stop or {}).items():
            if t > since:
                tokens[i] = 0
                if style == "histogram":
                    token_ms[i] = 0
        for i in idle or ():
            tokens[i], token_ms[i], running[i] = 0, 0, 0
        gd.ingest_progress(replace(b, tokens=tokens, token_ms=token_ms, running=running))
        evs.append(gd.evaluate(t))
    return evs


def first(evs, i, states):
    return next((ev.at for ev in evs if ev.states[i] in states), None)


def test_a_node_that_stops_decoding_is_cut_and_quarantined_in_seconds_whatever_the_source():
    # Before: a row with no token was "empty" and ignored, so a node whose streams stopped looked
    # healthy until its requests timed out.
    for style in ("slots", "histogram"):
        fleet = Fleet(8, seed=11)
        gd = GroupDetector(Thresholds(), fleet.nodes)
        drive(gd, fleet, 0, 40)
        evs = drive(gd, fleet, 40, 20, stop={3: 40.0}, style=style)
        cut = first(evs, 3, {NodeState.DEGRADED, NodeState.QUARANTINED, NodeState.PENDING_APPROVAL})
        quarantined = first(evs, 3, {NodeState.QUARANTINED, NodeState.PROBING})
        assert cut is not None and cut - 40 <= 1.5, style
        assert quarantined is not None and quarantined - 40 <= 4.0, style
        assert {t.node for ev in evs for t in ev.transitions} == {fleet.nodes[3]}, style


def test_a_hiccup_cuts_nobody_and_a_stall_that_lasts_is_cut_once_it_outlasts_one():
    fleet = Fleet(8, seed=12)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 40)
    evs = []
    for k in range(4):  # stalls of 0.75 s (three rows) 5 s apart: a host's hiccups
        evs += drive(gd, fleet, 40 + 5 * k, 0.75, stop={5: 0.0})
        evs += drive(gd, fleet, 40.75 + 5 * k, 4.25)
    assert all(ev.transitions == [] for ev in evs)
    evs = drive(gd, fleet, 60, 3, stop={5: 0.0})  # the same node, now stopped for good
    cut = first(evs, 5, {NodeState.DEGRADED, NodeState.QUARANTINED})
    persistence = gd.thresholds.quarantine_persistence_s
    assert cut is not None and persistence <= cut - 60 <= persistence + 0.75


def test_a_request_in_its_prefill_on_an_idle_node_is_not_a_stall():
    # The node was idle; a request arrives and runs its prefill for 2 s: running 1, no token yet. On an
    # inter-token histogram that is indistinguishable from a stall, so it is not judged.
    fleet = Fleet(8, seed=13)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 40)
    drive(gd, fleet, 40, 2, idle=[2])
    before = int(gd.ewma["decode"].count[2])
    evs = drive(gd, fleet, 42, 2, stop={2: 0.0}, style="histogram")
    assert all(ev.transitions == [] for ev in evs)
    assert math.isnan(gd.a.stall_from[2])
    assert int(gd.ewma["decode"].count[2]) == before  # no censored sample entered


def test_the_stall_start_survives_a_snapshot_and_an_idle_row_ends_it():
    fleet = Fleet(8, seed=14)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 20)
    drive(gd, fleet, 20, 0.5, stop={1: 0.0})
    assert gd.a.stall_from[1] == 20.0
    again = GroupDetector.from_bytes(gd.to_bytes())
    assert again.a.stall_from[1] == 20.0
    drive(again, fleet, 20.5, 0.25, idle=[1])
    assert math.isnan(again.a.stall_from[1])


def test_a_late_source_between_two_completions_is_never_a_stall():
    # llama.cpp without /slots: its token counters move when a request ends. Between the two captures
    # both slots were busy (requests_processing 2) and no request ended: no token, and no stall either.
    from pathlib import Path

    from detector.engine_metrics import parse, progress_row
    from detector.samples import ProgressBatch

    pages = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
    a, b = (parse((pages / f).read_text()) for f in ("metrics_a.txt", "metrics_b.txt"))
    assert a.running == b.running == 2
    row = progress_row("127.0.0.3:8000", (100.0, a), 100.25, b)
    assert row[3] == 0 and row[8] is None  # tokens, running: nothing a stall could be read from
    fleet = Fleet(8, seed=15)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    drive(gd, fleet, 0, 20)
    for k in range(12):  # 3 s of such rows right after a completion
        ts = 20.25 + 0.25 * k
        gd.ingest_progress(ProgressBatch.from_rows([[fleet.nodes[3], ts, *row[2:]]]))
    assert math.isnan(gd.a.stall_from[3])
