import numpy as np

from detector.window import SlidingWindows


def test_window_keeps_the_last_w_samples_and_percentiles_use_nearest_rank():
    rng = np.random.default_rng(0)
    w = SlidingWindows(3, 100)
    xs = {k: [] for k in range(3)}
    for _ in range(7):
        node = rng.integers(0, 3, 90)
        x = rng.lognormal(0, 1, 90)
        w.add(node, x.astype(np.float32))
        for k in range(3):
            xs[k].extend(x[node == k].astype(np.float32))
    q = w.percentiles((50.0, 99.0))
    for k in range(3):
        last = np.sort(np.array(xs[k][-100:]))
        assert w.filled[k] == min(len(xs[k]), 100)
        assert q[0, k] == last[round(0.5 * (len(last) - 1))]
        assert q[1, k] == last[round(0.99 * (len(last) - 1))]


def test_more_samples_than_the_window_in_one_batch():
    w = SlidingWindows(1, 10)
    w.add(np.zeros(25, dtype=int), np.arange(25, dtype=np.float32))
    assert sorted(w.values[0].tolist()) == list(range(15, 25))
    assert np.isnan(SlidingWindows(2, 10).percentiles()).all()
