import numpy as np

from detector.detectors.cross_p50 import cross_p50_slow
from detector.detectors.tail import TailStatus, tail_step


def _step(status, windows, p50, p99, filled):
    return tail_step(status, windows, np.array(p50), np.array(p99), np.array(filled),
                     min_samples=100, ratio=3.0, windows=3)


def test_insufficient_under_100_samples():
    st, _ = _step(np.zeros(4, np.int8), np.zeros(4, int), [1, 1, 1, 1], [9, 1.2, 1.2, 1.2], [99, 500, 500, 500])
    assert st[0] == TailStatus.INSUFFICIENT


def test_suspect_then_unhealthy_after_three_windows_then_recovered():
    st, w = np.zeros(4, np.int8), np.zeros(4, int)
    seen = []
    for _ in range(3):
        st, w = _step(st, w, [1, 1, 1, 1], [4.0, 1.3, 1.2, 1.4], [500] * 4)
        seen.append(TailStatus(int(st[0])))
    assert seen == [TailStatus.SUSPECT, TailStatus.SUSPECT, TailStatus.UNHEALTHY]
    assert (st[1:] == TailStatus.HEALTHY).all()
    st, w = _step(st, w, [1, 1, 1, 1], [2.0, 1.3, 1.2, 1.4], [500] * 4)
    assert st[0] == TailStatus.HEALTHY and w[0] == 0


def test_a_group_wide_wide_tail_is_not_a_node_fault():
    st, _ = _step(np.zeros(4, np.int8), np.zeros(4, int), [1, 1, 1, 1], [3.5, 3.6, 3.4, 3.7], [500] * 4)
    assert (st == TailStatus.HEALTHY).all()


def test_cross_node_p50_twice_the_median():
    p50 = np.array([1.0, 1.1, 0.9, 1.0, 2.5])
    slow = cross_p50_slow(p50, np.ones(5, bool), np.ones(5, bool), factor=2.0)
    assert slow.tolist() == [False, False, False, False, True]
