import numpy as np
import pytest

from detector.picking import PowerOfTwoChoices, SmoothWeightedRoundRobin


def test_smooth_wrr_is_exact_and_interleaved_like_nginx():
    wrr = SmoothWeightedRoundRobin([5, 1, 1])
    picks = [wrr.pick() for _ in range(7)]
    assert picks == [0, 0, 1, 0, 2, 0, 0]
    counts = np.bincount([wrr.pick() for _ in range(700)], minlength=3)
    assert counts.tolist() == [500, 100, 100]


def test_zero_weight_is_never_picked_and_all_zero_is_an_error():
    wrr = SmoothWeightedRoundRobin([0, 3])
    assert {wrr.pick() for _ in range(10)} == {1}
    with pytest.raises(LookupError):
        SmoothWeightedRoundRobin([0, 0]).pick()


def test_p2c_prefers_the_less_loaded_of_two():
    p2c = PowerOfTwoChoices(np.random.default_rng(0))
    picks = [p2c.pick([1, 1, 1], [10, 0, 10]) for _ in range(300)]
    share = picks.count(1) / 300
    assert 0.6 < share < 0.75  # node 1 wins whenever drawn (2 of 3 pairs): 2/3
    assert {p2c.pick([0, 1, 0], [0, 0, 0]) for _ in range(5)} == {1}


def test_a_node_back_from_weight_zero_starts_from_zero_credit():
    wrr = SmoothWeightedRoundRobin([1, 1])
    wrr.set_weights([0, 1])
    assert {wrr.pick() for _ in range(5)} == {1}
    wrr.set_weights([1, 1])  # node 0 back: plain alternation at once, no burst of saved-up picks
    assert [wrr.pick() for _ in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])
    with pytest.raises(ValueError):
        wrr.set_weights([1, float("nan")])
