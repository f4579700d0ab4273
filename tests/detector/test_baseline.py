import math
import statistics

import numpy as np
import pytest

from detector.baseline import robust_sd, robust_zscores, seed_zscores
from detector.group import GroupDetector
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet, run


def test_samuelson_bound_caps_the_seed_z_at_sqrt_m_minus_1():
    # 13 nodes, one 10x slower: the population std includes the outlier.
    ema = np.array([1.0] * 12 + [10.0])
    pb = seed_zscores(ema, np.full(13, 100), np.zeros(13, dtype=bool))
    assert math.isclose(pb.z[-1], math.sqrt(12), rel_tol=1e-6)  # 3.46 < 3.5: never quarantined
    assert pb.z[-1] < 3.5
    # ... while median/MAD sees it for what it is.
    rb = robust_zscores(ema, np.ones(13, bool), np.ones(13, bool), min_peers=3, spread_floor=0.05)
    assert rb.z[-1] > 100


def test_seed_z_explodes_in_a_uniform_group_robust_does_not():
    # 64 nodes agreeing to 0.1%, one of them 1% slower: the seed calls that a Z of ~6.
    ema = np.append(1.0 + 0.001 * np.random.default_rng(0).standard_normal(63), 1.01)
    seed = seed_zscores(ema, np.full(64, 100), np.zeros(64, dtype=bool))
    assert seed.z[-1] > 3.5
    robust = robust_zscores(ema, np.ones(64, bool), np.ones(64, bool), min_peers=3, spread_floor=0.05)
    assert robust.z[-1] < 0.5


def test_seed_needs_three_nodes_with_more_than_five_samples():
    pb = seed_zscores(np.array([1.0, 2.0, 3.0]), np.array([6, 6, 5]), np.zeros(3, dtype=bool))
    assert np.isnan(pb.z).all() and pb.peers == 2


def _drive(mode: str) -> list[NodeState]:
    fleet = Fleet(13, seed=2, rate=120)
    gd = GroupDetector(Thresholds(baseline_mode=mode), fleet.nodes)
    run(gd, fleet, 0, 20)
    fleet.slow[4] = 10.0
    evs = run(gd, fleet, 20, 20)
    return [NodeState(int(ev.states[4])) for ev in evs]


def test_thirteen_nodes_one_10x_slower_seed_mode_never_quarantines_robust_does():
    assert NodeState.QUARANTINED not in _drive("seed")
    assert NodeState.QUARANTINED in _drive("robust")


def test_robust_sd_is_scaled_mad_and_ignores_a_minority_of_outliers():
    """The one robust spread (1.4826 x MAD) every part of the detector uses: against a plain-Python
    reference, near the true sd for normal values, and not moved by 30 % of values 100x off."""
    x = np.random.default_rng(7).normal(10.0, 2.0, 20_001)
    med = statistics.median(x.tolist())
    reference = 1.4826 * statistics.median(abs(v - med) for v in x.tolist())
    assert robust_sd(x) == pytest.approx(reference, rel=1e-12)
    assert robust_sd(x) == pytest.approx(2.0, rel=0.03)
    spoiled = x.copy()
    spoiled[: 6_000] = 1000.0
    assert robust_sd(spoiled) < 4.0 < 100 < float(np.std(spoiled))


def test_references_round_trip_through_the_snapshot_layout_and_read_nan_when_unknown():
    from detector.baseline import References

    refs = References()
    assert math.isnan(refs.of("decode").baseline) and refs.to_dict() == {}  # reading adds nothing
    refs.of("decode").baseline = 20.0  # a write to an unknown signal's reference goes nowhere
    assert math.isnan(refs.of("decode").baseline) and math.isnan(References().of("decode").baseline)
    refs.at("norm").baseline, refs.at("norm").request_rel_sd = 900.0, 0.12
    assert refs.of("norm").rel_sd("row_rel_sd") == 0.12  # no row spread yet: the per-request one
    refs.at("norm").row_rel_sd = 0.05
    assert refs.of("norm").rel_sd("row_rel_sd") == 0.05
    back = References.from_dict({**refs.to_dict(), "fit_at": 12.0})  # an older snapshot's key ignored
    assert back.to_dict() == {"baseline:norm": 900.0, "request_rel_sd:norm": 0.12, "row_rel_sd:norm": 0.05}
