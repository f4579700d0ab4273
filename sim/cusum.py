"""The statistical floor: expected delay of an optimal CUSUM on the same per-request signal.

Page's CUSUM ``S_n = max(0, S_{n-1} + x_n - k)`` (x in units of the pre-change sd, centred on the
pre-change mean), alarm when ``S_n > h``, is exactly optimal in Lorden's worst-case-delay sense for a
known mean shift (Moustakides 1986). For iid N(0,1) -> N(δ,1) and ``k = δ/2``, Siegmund's (1985)
approximations, with ``b = h + 1.166`` (the overshoot correction ``2*0.583``), are:

    ARL0 ≈ (exp(2*k*b) - 2*k*b - 1) / (2*k²)                 (mean samples to a false alarm)
    ARL1 ≈ (exp(-2*Δ*b) + 2*Δ*b - 1) / (2*Δ²),  Δ = δ - k    (mean samples to detect the shift)

``h`` is solved from the false-alarm budget ARL0 by bisection, then ARL1 is the floor in samples;
``data/traces/cusum_gaussian_shift_bounds.csv`` tabulates both (tests reproduce it).
"""

from __future__ import annotations

import math

import numpy as np

OVERSHOOT = 1.166


def siegmund_arl0(h: float, k: float) -> float:
    """In-control ARL of a CUSUM with reference ``k > 0`` and threshold ``h`` (Siegmund)."""
    b = h + OVERSHOOT
    return (math.exp(2 * k * b) - 2 * k * b - 1) / (2 * k * k)


def siegmund_arl1(h: float, delta: float, k: float) -> float:
    """Out-of-control ARL for a shift ``delta`` (sd units), ``Δ = delta - k`` (Siegmund)."""
    b = h + OVERSHOOT
    d = delta - k
    if abs(d) < 1e-9:
        return b * b  # limit Δ -> 0
    return (math.exp(-2 * d * b) + 2 * d * b - 1) / (2 * d * d)


def threshold_for_arl0(arl0: float, k: float) -> float:
    """``h >= 0`` with ``siegmund_arl0(h, k) == arl0`` (bisection; 0 if even h=0 exceeds it)."""
    if siegmund_arl0(0.0, k) >= arl0:
        return 0.0
    lo, hi = 0.0, 1.0
    while siegmund_arl0(hi, k) < arl0:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if siegmund_arl0(mid, k) < arl0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def cusum_min_delay(delta: float, arl0: float) -> float | None:
    """Floor on detection delay in samples for a shift of ``delta`` sd at false-alarm budget ``arl0``.

    ``k = delta / 2``; returns ``None`` for a non-positive shift (nothing to detect) and at least 1
    (a detector needs one sample of the changed distribution).
    """
    if not math.isfinite(delta):
        return 1.0
    if delta <= 0:
        return None
    k = delta / 2
    h = threshold_for_arl0(arl0, k)
    return max(1.0, siegmund_arl1(h, delta, k))


def oracle_cusum_alarm(x: np.ndarray, k: float, h: float) -> int | None:
    """Index of the first sample at which Page's CUSUM ``S_n = max(0, S_{n-1} + x_n - k)`` exceeds
    ``h``, or ``None``. ``x`` is already standardised on the pre-change mean and sd (the oracle knows
    them), in the order a detector would see the samples."""
    s = 0.0
    for i, v in enumerate(x):  # sequential by definition; a few hundred samples at most
        s = max(0.0, s + float(v) - k)
        if s > h:
            return i
    return None
