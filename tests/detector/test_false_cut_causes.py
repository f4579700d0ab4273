"""Issue 25: the causes of false cuts and quarantines found in the simulator, each fixed at the signal.

- A long prompt's chunked prefill holds every decode stream of a healthy node for half a second: rows
  past the decode curve's prompt work are no decode sample for the first ``PREFILL_STALL_S`` of such an
  episode; an episode that lasts (a node recomputing lost KV cache) counts.
- A node cut to a few streams while its peers run full batches is compared far from where the healthy
  rows are: its rows count toward no quarantine (``COMPARABLE_LOAD_FRACTION``).
- Prefill time decides only over its own line: a prefill Z near (not over) ``prefill_materiality`` must
  not hide a decode over its line.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from detector import GroupDetector, NodeState, ProgressBatch, Thresholds
from detector.costmodel import CostModel
from detector.detectors import zscore
from detector.detectors.verdict import PeerView
from detector.detectors.zscore import decide, lines
from detector.signals import SIGNALS
from detector.thresholds import COMPARABLE_LOAD_FRACTION, PREFILL_STALL_S

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


def _rows(ts: list[float], work: list[float]) -> ProgressBatch:
    k = len(ts)
    b = ProgressBatch.from_columns(node=["n0"] * k, ts=ts, interval_s=[0.25] * k, tokens=[20.0] * k,
                                   token_ms=[20.0 * 300] * k, prefill_work=[w * 20.0 for w in work],
                                   running=[16.0] * k)
    return replace(b, node=np.zeros(k, dtype=np.int64))


def test_a_long_prompts_rows_are_no_decode_sample_but_lasting_prefill_work_is():
    gd = _with_curve()
    # One 8k-token prompt: three rows (0.5 s) past the curve's work range, then back.
    passing = gd._passing_prefill(_rows([10.0, 10.25, 10.5, 10.75], [545.0, 584.0, 220.0, 3.0]))
    assert passing.tolist() == [True, True, True, False]
    # A node recomputing KV cache it keeps losing: bursts that last; from PREFILL_STALL_S in, they count.
    ts = [20.0 + 0.25 * k for k in range(8)]
    work = [203.0, 229.0, 227.0, 30.0, 225.0, 223.0, 208.0, 210.0]
    passing = gd._passing_prefill(_rows(ts, work))
    assert passing.tolist() == [t - 20.0 < PREFILL_STALL_S and w > 100.0 for t, w in zip(ts, work, strict=True)]
    # Without a decode curve there is no range to be past.
    plain = GroupDetector(Thresholds(), ["n0"])
    assert not plain._passing_prefill(_rows([1.0], [900.0])).any()


def test_a_row_at_a_fraction_of_its_peers_batch_counts_toward_no_quarantine():
    gd = GroupDetector(Thresholds(), [f"n{i}" for i in range(5)])
    running = np.array([4.0, 16.0, 18.0, 20.0, np.nan])
    healthy = np.array([False, True, True, True, True])
    assert COMPARABLE_LOAD_FRACTION * 18.0 > 4.0
    assert gd._at_peer_load(running, healthy).tolist() == [False, True, True, True, True]
    # Its slow rows count as samples, none of them over the quarantine line, and build no evidence_q.
    a, t = gd.a, gd.thresholds
    gd._last.of("decode").baseline = 20.0
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
    assert SIGNALS[int(d.which[0])] == "decode" and bool(lines(d, t).over_d[0])
    # Prefill time over its line decides, and cuts.
    d = decide(_view(3.0, 6.0, 1.3, 1.6), a, t, 0.0)
    assert SIGNALS[int(d.which[0])] == "prefill_time" and bool(lines(d, t).over_d[0])
    # A node cut on it keeps it while it is over its exit line (hysteresis), not over the cut line.
    a.state[0] = S.DEGRADED
    d = decide(_view(0.5, 4.0, 1.02, 1.3), a, t, 0.0)
    ln = lines(d, t)
    assert SIGNALS[int(d.which[0])] == "prefill_time" and bool(ln.still_d[0]) and not bool(ln.over_d[0])
