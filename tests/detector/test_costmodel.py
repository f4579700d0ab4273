import numpy as np

from detector.costmodel import Reservoir, fit_cost_model


def _requests(rng, k):
    p = np.minimum(rng.lognormal(np.log(1000), 1.0, k), 16000).round()
    c = np.maximum(np.minimum(rng.lognormal(np.log(180), 0.9, k), 2000).round(), 1)
    return p, c


def test_fit_recovers_known_costs_within_5_percent():
    rng = np.random.default_rng(3)
    p, c = _requests(rng, 4000)
    y = (0.12 * p + 14.0 * c + 25.0) * rng.lognormal(0, 0.08, len(p))
    fit = fit_cost_model(np.column_stack([p, c]), y)
    a, b, _ = fit.coef
    assert abs(a / 0.12 - 1) < 0.05
    assert abs(b / 14.0 - 1) < 0.05


def test_one_slow_node_among_fitted_does_not_drag_the_fit():
    rng = np.random.default_rng(4)
    p, c = _requests(rng, 4000)
    y = (0.12 * p + 14.0 * c) * rng.lognormal(0, 0.08, len(p))
    slow = rng.random(len(p)) < 1 / 16  # one node of 16, 2.86x slower (thermal throttle)
    y[slow] *= 2.86
    fit = fit_cost_model(np.column_stack([p, c]), y)
    assert abs(fit.coef[1] / 14.0 - 1) < 0.05
    assert abs(fit.coef[0] / 0.12 - 1) < 0.05


def test_learned_signal_spread_is_close_to_injected_noise_and_far_below_fixed_w():
    rng = np.random.default_rng(5)
    p, c = _requests(rng, 4000)
    noise = 0.08
    y = (0.12 * p + 14.0 * c) * rng.lognormal(0, noise, len(p))
    fit = fit_cost_model(np.column_stack([p, c]), y)
    learned = np.log(y / fit.predict(np.column_stack([p, c])))
    seed = np.log(y / (p * 0.25 + c))
    assert learned.std() <= 1.2 * noise
    assert seed.std() > 5 * learned.std()  # the fixed w inherits the spread of the token mix


def test_too_few_samples_gives_no_model():
    assert fit_cost_model(np.array([[1.0, 2.0]] * 4), np.array([1.0, 2.0, 3.0, 4.0])) is None


def test_reservoir_keeps_the_newest_rows_and_a_resize_keeps_the_newest_that_fit():
    r = Reservoir(("x", "y"), 5)
    r.add(x=np.arange(3.0), y=-np.arange(3.0))
    assert r.filled == 3 and sorted(r.rows()["x"]) == [0, 1, 2]
    r.add(x=np.arange(3.0, 10.0), y=-np.arange(3.0, 10.0))  # more than the room left, and than the capacity
    assert r.filled == 5 and sorted(r.rows()["x"]) == [5, 6, 7, 8, 9]
    assert all(r.rows()["y"] == -r.rows()["x"])  # rows stay whole
    small = r.resized(2)
    assert sorted(small.rows()["x"]) == [8, 9]
    big = r.resized(8)
    big.add(x=np.array([10.0]), y=np.array([-10.0]))
    assert big.filled == 6 and sorted(big.rows()["x"]) == [5, 6, 7, 8, 9, 10]
