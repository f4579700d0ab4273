"""The preview's replay (a pure function) follows the detector's drain rule for groups without TTFT and
its persistence in seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from detector.thresholds import Thresholds
from outlier_admin.history import preview
from outlier_admin.history.replay import build

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def replay(rows, t, node_count, baselines=None, *, signal="decode", also=None):
    """The preview's replay of history rows ``(at, node, z, ema, p50, p99, state, evidence)`` of
    ``signal`` (P50/P99 go on the ``norm`` rows, as the tick writes them), stored ``baselines``
    ``{at: baseline}``, and ``also`` ``{signal: (rows, baselines)}``."""
    stored, out = [], []
    for sig, (sig_rows, base) in {signal: (rows, baselines or {}), **(also or {})}.items():
        for at, node, z, ema, p50, p99, state, ev in sig_rows:
            out.append((node, at.timestamp(), sig, z, ema, None, None, state, ev, False))
            if sig == signal and sig != "norm":
                out.append((node, at.timestamp(), "norm", None, None, p50, p99, state, None, False))
            elif sig == "norm":
                out[-1] = (node, at.timestamp(), sig, z, ema, p50, p99, state, ev, False)
        stored += [(at, sig, b) for at, b in base.items()]
    return preview.replay(build(out, stored), t, node_count, signal=signal, also=tuple(also or ()))


def rows(count: int) -> list[tuple]:
    # One slow node (Z 4, EMA 2x the baseline) among three, a row a second, recorded healthy.
    out = []
    for i in range(count):
        at = T0 + timedelta(seconds=i)
        out.append((at, "slow", 4.0, 2.0, None, None, "healthy", None))
        out += [(at, f"peer{k}", 0.0, 1.0, None, None, "healthy", None) for k in range(2)]
    return out


def quarantined_at(transitions) -> float | None:
    return next(((t.at - T0).total_seconds() for t in transitions if t.to_state == "quarantined"), None)


def test_without_ttft_quarantine_waits_for_the_drained_rows():
    t = Thresholds(queue_drain_s=10.0)
    baselines = {T0 + timedelta(seconds=i): 1.0 for i in range(40)}
    with_ttft = replay(rows(40), t, node_count=10, baselines=baselines)
    without = replay(rows(40), t, node_count=10, baselines=baselines, signal="norm")
    # Both cut the node at once; with TTFT it is quarantined once it has held the line for
    # quarantine_persistence_s (1 s) over 3 evaluations (the third row), without TTFT the same from
    # 10 s after the cut.
    assert [x.to_state for x in with_ttft][:1] == ["degraded"] == [x.to_state for x in without][:1]
    assert quarantined_at(with_ttft) == 2.0
    assert quarantined_at(without) == 12.0
    # Persistence as a count (quarantine_persistence_s = 0): the 10th row over the line.
    count = t.replace(quarantine_persistence_s=0.0)
    assert quarantined_at(replay(rows(40), count, node_count=10, baselines=baselines)) == 9.0
    assert quarantined_at(replay(rows(40), count, node_count=10, baselines=baselines, signal="norm")) == 19.0


def test_the_replay_holds_persistence_in_seconds_as_a_tick_does():
    """The time the node held the line between history steps decides, so a longer
    quarantine_persistence_s shows in the preview as it would act live (5 s: the row 5 s after the
    first one over the line)."""
    t = Thresholds(quarantine_persistence_s=5.0)
    baselines = {T0 + timedelta(seconds=i): 1.0 for i in range(40)}
    assert quarantined_at(replay(rows(40), t, node_count=10, baselines=baselines)) == 5.0


def test_the_replay_decides_with_the_detectors_ejection_layer():
    """The preview has no rules of its own: dry run, the safeguard's cap and approval come from
    detector.ejection, as in a tick."""
    t = Thresholds()
    baselines = {T0 + timedelta(seconds=i): 1.0 for i in range(40)}
    assert quarantined_at(replay(rows(40), t, node_count=10, baselines=baselines)) == 2.0
    dry = replay(rows(40), t.replace(dry_run=["z_quarantine"]), node_count=10, baselines=baselines)
    assert quarantined_at(dry) is None and [x.to_state for x in dry] == ["degraded"]
    capped = replay(rows(40), t, node_count=3, baselines=baselines)  # 30% of 3 nodes: none may go
    assert quarantined_at(capped) is None
    approval = replay(rows(40), t.replace(require_approval=True), node_count=10, baselines=baselines)
    assert [(x.to_state, x.rule) for x in approval][-1] == ("pending_approval", "z_quarantine")


def test_a_node_slow_only_in_prefill_is_replayed_on_the_larger_queue_free_z():
    # Decode rows say all three nodes are fine; the prefill-time rows say one is 2x slow: the replay
    # judges it on the larger queue-free Z, as the detector does, and without them it would not.
    t = Thresholds()
    at = [T0 + timedelta(seconds=i) for i in range(40)]
    decode = [(a, n, 0.0, 1.0, None, None, "healthy", None) for a in at for n in ("slow", "peer0", "peer1")]
    prefill = [(a, "slow", 4.0, 2.0, None, None, "healthy", None) for a in at]
    prefill += [(a, f"peer{k}", 0.0, 1.0, None, None, "healthy", None) for a in at for k in range(2)]
    ones = dict.fromkeys(at, 1.0)
    assert replay(decode, t, node_count=10, baselines=ones) == []
    both = replay(decode, t, node_count=10, baselines=ones, also={"prefill_time": (prefill, ones)})
    # Cut on its evidence, never quarantined on prefill time alone (detector.detectors.zscore).
    assert [(x.node, x.to_state) for x in both] == [("slow", "degraded")] and quarantined_at(both) is None


def test_a_node_the_safeguard_holds_is_told_by_the_moves_flag_not_its_text():
    """A node whose P99/P50 stays 10 while its peers' is 2 (Z 2.5 and EMA 1.3x: over the degrade line
    the tail verdict is gated on, but without the evidence a cut needs) is taken out on tail_ratio at
    the third window in a group of 10; in a group of 3 the cap (30 %: none) holds it in service, which
    the replay names ``safeguard_blocked`` from the move's flag. (At Z 1, within the peers' spread,
    the tail verdict does not stand: ``Decision.gate``.)"""
    t = Thresholds()
    at = [T0 + timedelta(seconds=i) for i in range(6)]
    rows = [(a, "slow", 2.5, 1.3, 1.0, 10.0, "healthy", 0.0) for a in at]
    rows += [(a, f"peer{k}", 0.0, 1.0, 1.0, 2.0, "healthy", 0.0) for a in at for k in range(2)]
    ones = dict.fromkeys(at, 1.0)
    out = replay(rows, t, node_count=10, baselines=ones)
    assert [(x.node, x.to_state, x.rule, (x.at - T0).total_seconds()) for x in out] == [
        ("slow", "quarantined", "tail_ratio", 2.0)]
    held = replay(rows, t, node_count=3, baselines=ones)
    assert [(x.node, x.to_state, x.rule) for x in held] == [("slow", "degraded", "safeguard_blocked")]
    within_spread = [(a, n, 1.0 if n == "slow" else z, e, p50, p99, st, ev) for a, n, z, e, p50, p99, st, ev in rows]
    assert replay(within_spread, t, node_count=10, baselines=ones) == []


def test_a_group_deciding_on_prefill_time_is_replayed_on_it():
    """A group whose only queue-free signal is the servers' prefill time: its rows are replayed as
    prefill time, which cuts a slow node but never quarantines it (detector.detectors.zscore), not as
    decode, which would."""
    t = Thresholds()
    baselines = {T0 + timedelta(seconds=i): 1.0 for i in range(40)}
    as_prefill = replay(rows(40), t, node_count=10, baselines=baselines, signal="prefill_time")
    assert [(x.node, x.to_state) for x in as_prefill] == [("slow", "degraded")]
    assert quarantined_at(replay(rows(40), t, node_count=10, baselines=baselines, signal="decode")) == 2.0
