"""Issue 25: the causes of false cuts and quarantines found in the simulator, each fixed at the signal.

- A long prompt's chunked prefill holds every decode stream of a healthy node for half a second: rows
  past the decode curve's prompt work are no decode sample for the first ``PREFILL_STALL_S`` of such an
  episode; an episode that lasts, or one that follows a preemption (a node recomputing the KV cache
  it evicted), counts, and the recomputed prompts are not credited to it as work.
- A node cut to a few streams while its peers run full batches is compared far from where the healthy
  rows are: its rows count toward no quarantine (``COMPARABLE_LOAD_FRACTION``), unless it preempts
  (it runs as many streams as its own KV cache holds).
- Prefill time decides only over its own line: a prefill Z near (not over) ``prefill_materiality`` must
  not hide a decode over its line; and a prefill time over it must not hide a decode at quarantine
  strength.
- A tail (or cross-P50) verdict stands only where the decode is over the degrade line, its Z as well
  as its materiality: a P99 over 100 requests is their top one or two.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from detector.costmodel import CostModel
from detector.detectors import zscore
from detector.detectors.verdict import PeerView
from detector.detectors.zscore import decide, lines
from detector.group import GroupDetector
from detector.samples import ProgressBatch
from detector.signals import SIGNALS
from detector.states import NodeState
from detector.thresholds import COMPARABLE_LOAD_FRACTION, PREFILL_STALL_S, Thresholds

S = NodeState


def _with_curve(n: int = 2) -> GroupDetector:
    """A detector whose decode curve covers prompt work up to 100 tokens per decode token."""
    gd = GroupDetector(Thresholds(), [f"n{i}" for i in range(n)])
    sig = gd.signals
    sig.fit_batch = CostModel(coef=np.array([0.3, 0.01, 0.001, 14.0]), residual_sd=0.05, n_samples=500)
    sig.load_features = ("b", "w", "p")
    sig.load_ref = {"b": [16.0, 64.0, 4.0], "w": [5.0, 100.0, 0.0], "p": [80.0, 2000.0, 0.0]}
    sig.batch_flat = False
    return gd


def _rows(ts: list[float], work: list[float], preempted: list[float] | None = None) -> ProgressBatch:
    k = len(ts)
    b = ProgressBatch.from_columns(node=["n0"] * k, ts=ts, interval_s=[0.25] * k, tokens=[20.0] * k,
                                   token_ms=[20.0 * 300] * k, prefill_work=[w * 20.0 for w in work],
                                   running=[16.0] * k, preempted=preempted)
    return replace(b, node=np.zeros(k, dtype=np.int64))


def _passing(gd: GroupDetector, rows: ProgressBatch) -> np.ndarray:
    return gd._passing_prefill(rows, gd._since_preemption(rows) <= PREFILL_STALL_S)


def test_a_long_prompts_rows_are_no_decode_sample_but_lasting_prefill_work_is():
    gd = _with_curve()
    # One 8k-token prompt: three rows (0.5 s) past the curve's work range, then back.
    passing = _passing(gd, _rows([10.0, 10.25, 10.5, 10.75], [545.0, 584.0, 220.0, 3.0]))
    assert passing.tolist() == [True, True, True, False]
    # A node recomputing KV cache it keeps losing: bursts that last; from PREFILL_STALL_S in, they count.
    ts = [20.0 + 0.25 * k for k in range(8)]
    work = [203.0, 229.0, 227.0, 30.0, 225.0, 223.0, 208.0, 210.0]
    passing = _passing(gd, _rows(ts, work))
    assert passing.tolist() == [t - 20.0 < PREFILL_STALL_S and w > 100.0 for t, w in zip(ts, work, strict=True)]
    # Without a decode curve there is no range to be past.
    plain = GroupDetector(Thresholds(), ["n0"])
    assert not _passing(plain, _rows([1.0], [900.0])).any()


def test_prompt_work_after_a_preemption_is_the_nodes_own_and_counts_at_once():
    gd = _with_curve()
    # vLLM preempted two requests (its KV cache was full) and computes their prompts again: the same
    # work a long prompt makes, but the node's own; every row counts, from the first.
    ts = [30.0, 30.25, 30.5, 30.75]
    rows = _rows(ts, [545.0, 584.0, 220.0, 3.0], preempted=[2.0, 0.0, 0.0, 0.0])
    since = gd._since_preemption(rows)
    assert since.tolist() == [0.0, 0.25, 0.5, 0.75] and gd.a.preempted_at[0] == 30.0
    assert not gd._passing_prefill(rows, since <= PREFILL_STALL_S).any()
    # A preemption seen in an earlier batch still counts within PREFILL_STALL_S, not after it.
    later = _rows([30.6 + PREFILL_STALL_S, 31.5 + PREFILL_STALL_S], [545.0, 545.0])
    assert gd._since_preemption(later) == pytest.approx([0.6 + PREFILL_STALL_S, 1.5 + PREFILL_STALL_S])
    assert _passing(gd, _rows([30.5, 35.0], [545.0, 545.0])).tolist() == [False, True]
    # The curve does not credit the recomputed prompts as work: a row at 90 prompt tokens per decode
    # token is read at the healthy median (5, the reference: 300 ms as measured), not at 90 (whose
    # predicted step time, 21.1 ms against 18.9 ms, would excuse 10 % of it).
    recomputing = np.array([True, False])
    row = _rows([40.0, 40.0], [90.0, 90.0])
    x = gd.signals.per_row(row, recomputing)["decode"]
    assert x[0] == pytest.approx(300.0) and x[1] == pytest.approx(300.0 * 18.93 / 21.14, rel=1e-3), x
    # A server that does not report preemptions (NaN) is read as before.
    assert np.isnan(gd._since_preemption(replace(_rows([50.0], [545.0]), node=np.array([1])))).all()


def test_a_row_at_a_fraction_of_its_peers_batch_counts_toward_no_quarantine():
    gd = GroupDetector(Thresholds(), [f"n{i}" for i in range(5)])
    running = np.array([4.0, 16.0, 18.0, 20.0, np.nan])
    healthy = np.array([False, True, True, True, True])
    assert COMPARABLE_LOAD_FRACTION * 18.0 > 4.0
    never = np.zeros(5, dtype=bool)
    assert gd._at_peer_load(running, healthy, never).tolist() == [False, True, True, True, True]
    # A node that just preempted runs as many streams as its KV cache holds: its small batch counts.
    since = np.array([0.25, np.nan, np.nan, np.nan, np.nan])
    with np.errstate(invalid="ignore"):
        assert gd._at_peer_load(running, healthy, since <= PREFILL_STALL_S)[0]
        assert not gd._at_peer_load(running, healthy, since + PREFILL_STALL_S <= PREFILL_STALL_S)[0]
    # Its slow rows count as samples, none of them over the quarantine line, and build no evidence_q.
    a, t = gd.a, gd.thresholds
    gd._last.at("decode").baseline = 20.0
    node = np.zeros(4, dtype=np.int64)
    v = np.full(4, 40.0)  # 2x its peers
    zscore.feed_evidence(a, t, gd._last, node, v, "decode", 0.05, comparable=np.zeros(4, dtype=bool))
    assert (int(a.q_count[0]), int(a.q_hits[0]), float(a.evidence_q[0])) == (4, 0, 0.0)
    assert a.evidence[0] > t.degrade_evidence  # the cut's evidence is not touched
    zscore.feed_evidence(a, t, gd._last, node, v, "decode", 0.05, comparable=np.ones(4, dtype=bool))
    assert int(a.q_hits[0]) == 4 and a.evidence_q[0] > 0


def _view(z_decode: float, z_prefill: float, ex_decode: float, ex_prefill: float) -> PeerView:
    n = 1
    z = np.full((len(SIGNALS), n), np.nan)
    ema = np.full((len(SIGNALS), n), np.nan)
    base = dict.fromkeys(SIGNALS, math.nan)
    for s, zz, ex in (("decode", z_decode, ex_decode), ("prefill_time", z_prefill, ex_prefill)):
        k = SIGNALS.index(s)
        z[k], ema[k], base[s] = zz, ex, 1.0
    return PeerView(z=z, ema=ema, baseline=base, spread=dict.fromkeys(SIGNALS, 0.05),
                    peers=dict.fromkeys(SIGNALS, 16), fresh=np.ones(n, dtype=bool))


def test_prefill_time_decides_only_over_its_own_line():
    t = Thresholds()  # decode cut line 1.15x, prefill time 1.5x (exit 1.25x)
    gd = GroupDetector(t, ["n0"])
    a = gd.a
    # Healthy: decode over its line (Z 3, 1.3x), prefill time near but under its own (Z 5, 1.3x).
    d = decide(_view(3.0, 5.0, 1.3, 1.3), a, t, 0.0)
    assert SIGNALS[int(d.cut_which[0])] == "decode" and bool(lines(d, t).over_d[0])
    # Prefill time over its line decides, and cuts.
    d = decide(_view(3.0, 6.0, 1.3, 1.6), a, t, 0.0)
    assert SIGNALS[int(d.cut_which[0])] == "prefill_time" and bool(lines(d, t).over_d[0])
    # A node cut on it keeps it while it is over its exit line (hysteresis), not over the cut line.
    a.state[0] = S.DEGRADED
    d = decide(_view(0.5, 4.0, 1.02, 1.3), a, t, 0.0)
    ln = lines(d, t)
    assert SIGNALS[int(d.cut_which[0])] == "prefill_time" and bool(ln.still_d[0]) and not bool(ln.over_d[0])


def test_a_prefill_time_further_out_than_the_decode_does_not_hide_a_decode_at_quarantine_strength():
    t = Thresholds()
    gd = GroupDetector(t, ["n0"])
    # A node whose prefill is 5x slow streams 2x slow while it computes prompts: cut on the prefill
    # time (the larger Z), at quarantine strength on the decode.
    d = decide(_view(8.0, 15.0, 2.0, 5.0), gd.a, t, 0.0)
    ln = lines(d, t)
    assert SIGNALS[int(d.cut_which[0])] == "prefill_time" and bool(ln.over_d[0]) and bool(ln.over_q[0])
    # Its records name the signal of each decision: the cut the prefill time, the quarantine the decode.
    from detector.explain import transitions
    from detector.moves import Move
    from detector.states import Reason

    view = _view(8.0, 15.0, 2.0, 5.0)
    counts = {s: np.ones(1, dtype=np.int64) for s in SIGNALS}
    cut, out = transitions([Move(0, S.HEALTHY, S.DEGRADED, Reason.Z_DEGRADE),
                            Move(0, S.DEGRADED, S.QUARANTINED, Reason.Z_QUARANTINE)],
                           gd.a, t, 0.0, view, d, counts, np.zeros(1))
    assert (cut.signal, cut.z, out.signal, out.z) == ("prefill_time", 15.0, "decode", 8.0)
    # Prefill time alone never is.
    d = decide(_view(0.5, 15.0, 1.02, 5.0), gd.a, t, 0.0)
    ln = lines(d, t)
    assert bool(ln.over_d[0]) and not bool(ln.over_q[0])


def test_a_tail_verdict_stands_only_where_the_decode_is_over_the_degrade_line_z_and_materiality():
    from detector.detectors.verdict import Verdict
    from detector.states import Reason

    t = Thresholds()
    gd = GroupDetector(t, ["n0"])
    tail = Verdict(Reason.TAIL_RATIO, np.ones(1, dtype=bool))
    # long-context-16: one 32k-token request made a healthy node's P99/P50 read 3x for three windows
    # while its decode was 1.16x at Z 1.0 (within the peers' spread): the tail must not quarantine it.
    d = decide(_view(1.0, -0.6, 1.16, 0.95), gd.a, t, 0.0)
    assert not d.gate(tail, t).eject[0]
    # A node whose decode is over the degrade line (Z 3, 1.3x): the tail verdict stands.
    d = decide(_view(3.0, -0.6, 1.3, 0.95), gd.a, t, 0.0)
    assert d.gate(tail, t).eject[0]
    # Prefill time far out, decode within the spread: prefill time never takes a node out, here either.
    d = decide(_view(0.5, 9.0, 1.02, 3.0), gd.a, t, 0.0)
    assert not d.gate(tail, t).eject[0]
