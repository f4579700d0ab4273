import numpy as np

from detector.detectors.errors import consecutive_error_runs, success_rate_outliers


def test_consecutive_error_runs_reset_on_success_and_carry_across_batches():
    consec = np.zeros(3, dtype=np.int64)
    node = np.array([0, 0, 0, 1, 1, 0])
    err = np.array([True, False, True, True, True, True])
    consec = consecutive_error_runs(consec, node, err)
    assert consec.tolist() == [2, 2, 0]
    consec = consecutive_error_runs(consec, np.array([1, 1, 1]), np.array([True, True, True]))
    assert consec.tolist() == [2, 5, 0]


def test_success_rate_outlier_needs_five_hosts_with_100_requests():
    req = np.array([200, 200, 200, 200, 200, 200])
    ok = np.array([199, 198, 200, 199, 200, 120])
    out = success_rate_outliers(req, ok, min_hosts=5, min_requests=100, stdev_factor=1.9)
    assert out.tolist() == [False] * 5 + [True]
    few = success_rate_outliers(req[:4], ok[:4], min_hosts=5, min_requests=100, stdev_factor=1.9)
    assert not few.any()
