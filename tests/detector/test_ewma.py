import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.ewma import EwmaArrays


def reference(xs, alpha):
    """Seed 000's EMA and West's incremental EW variance, one sample at a time."""
    m, s = None, 0.0
    for x in xs:
        if m is None:
            m = x
            continue
        d = x - m
        m = m + alpha * d
        s = (1 - alpha) * (s + alpha * d * d)
    return m, s


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(0.1, 100.0)), min_size=1, max_size=60),
    st.integers(1, 5),
)
def test_batch_update_equals_one_by_one_and_the_reference(samples, chunks):
    alpha = 0.15
    node = np.array([s[0] for s in samples])
    x = np.array([s[1] for s in samples])
    batch = EwmaArrays(5, alpha)
    for part in np.array_split(np.arange(len(x)), chunks):
        batch.update(node[part], x[part])
    single = EwmaArrays(5, alpha)
    for i in range(len(x)):
        single.update(node[i : i + 1], x[i : i + 1])
    np.testing.assert_allclose(batch.mean, single.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(batch.variance(), single.variance(), rtol=1e-6, atol=1e-6)
    for k in range(5):
        xs = x[node == k]
        if len(xs):
            m, s = reference(xs, alpha)
            assert np.isclose(batch.mean[k], m, rtol=1e-9)
            assert np.isclose(batch.variance()[k], s, rtol=1e-6, atol=1e-6)
    assert batch.count.tolist() == [int((node == k).sum()) for k in range(5)]


def test_ema_crosses_the_line_within_5_to_8_slow_samples():
    # Steady at 1.0; the node turns 2x slow. Seed 000: "alpha 0.15 notices 5-8 slow requests".
    e = EwmaArrays(1, 0.15)
    e.update(np.zeros(50, dtype=int), np.ones(50))
    line = 1.5  # half-way to the new level
    crossed = None
    for k in range(1, 20):
        e.update(np.zeros(1, dtype=int), np.array([2.0]))
        if e.mean[0] >= line:
            crossed = k
            break
    assert crossed is not None and 4 <= crossed <= 8
