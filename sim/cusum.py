"""Change detection statistics: the oracle lower bound on detection delay, and Gaussian CUSUM theory.

**The oracle** (:class:`HistogramLLR`, :func:`cusum_alarms`, :func:`calibrate_threshold`; assembled per
policy and faulty node by :func:`sim.report.add_bounds`). Page's CUSUM on the log-likelihood ratio,
``S_n = max(0, S_{n-1} + log(p1(x_n) / p0(x_n)))``, alarm when ``S_n > h``, is optimal in Lorden's
worst-case-delay sense among all detectors with at least its mean time to a false alarm, for iid
samples from known ``p0`` (before the change) and ``p1`` (after) (Moustakides 1986). Our oracle is told
``p0`` and ``p1`` of the very samples a policy reads, as empirical histograms
(bin edges at the :data:`HIST_BINS`-quantiles of each, so where the two differ the bins are as
fine as either sample can resolve; :data:`PSEUDO_COUNT` added to each bin; :class:`HistogramLLR`), or
as the pre-fault kernel density moved by the post-onset shift (:class:`ShiftLLR`):
heavy tails and discrete values (an error, a timeout) are taken as they are, not as a Gaussian. A
sample with several values (a request's decode time and its total latency) adds their LLRs (their
joint law is not modelled; the threshold is calibrated on the same sums, so the sum costs false alarms
where it over-counts). ``h`` is set from false alarms counted on healthy nodes' samples
(:func:`calibrate_threshold`).

**Gaussian theory** (the scenario-level ``cusum_bound``, a reference, not a bound: it assumes iid
Gaussian samples and a fixed budget). Page's CUSUM ``S_n = max(0, S_{n-1} + x_n - k)`` (x in units of the pre-change sd, centred on the
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
from dataclasses import dataclass

import numpy as np

OVERSHOOT = 1.166
HIST_BINS = 12
PSEUDO_COUNT = 0.5
#: Samples scanned at once when looking for the next alarm (a vectorised CUSUM between restarts).
SCAN_BLOCK = 2048


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


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    vals, wts, sizes = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(yi)
        wts.append(wi)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            merged = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            size = sizes[-2] + sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
            vals[-1], wts[-1], sizes[-1] = merged, wsum, size
    return np.repeat(vals, sizes)


@dataclass(frozen=True)
class HistogramLLR:
    """``log(p1(x) / p0(x))`` of one signal from empirical histograms (module docstring); a missing
    value (NaN) carries no evidence (0)."""

    edges: np.ndarray
    table: np.ndarray

    @classmethod
    def fit(cls, pre: np.ndarray, post: np.ndarray, bins: int = HIST_BINS) -> HistogramLLR:
        """Bins at the quantiles of each sample (where the two differ, as fine as either resolves);
        per bin the share of post-onset samples, made monotone in ``x`` (a fault moves a signal one
        way: the likelihood ratio of a slowdown grows with the value; estimated from tens of
        post-onset samples, an unconstrained ratio zigzags from bin to bin and every zig is a false
        alarm on healthy nodes), in the direction of the medians' shift."""
        pre, post = pre[np.isfinite(pre)], post[np.isfinite(post)]
        pooled = np.concatenate([pre, post])
        inner = np.linspace(0.0, 1.0, bins + 1)[1:-1]
        edges = np.unique(np.concatenate([np.quantile(pre, inner), np.quantile(post, inner)]))
        if len(np.unique(pooled)) <= bins:  # discrete values (0/1 failures): one bin per value
            v = np.unique(pooled)
            edges = (v[1:] + v[:-1]) / 2.0
        k = len(edges) + 1
        c0 = np.bincount(np.searchsorted(edges, pre, side="right"), minlength=k) + PSEUDO_COUNT
        c1 = np.bincount(np.searchsorted(edges, post, side="right"), minlength=k) + PSEUDO_COUNT
        share = c1 / c1.sum() / (c1 / c1.sum() + c0 / c0.sum())  # P(post | bin) at equal priors
        up = np.median(post) >= np.median(pre)
        q = isotonic(share if up else share[::-1], c0 + c1 if up else (c0 + c1)[::-1])
        q = np.clip(q if up else q[::-1], 1e-6, 1 - 1e-6)
        return cls(edges=edges, table=np.log(q / (1.0 - q)))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        ok = np.isfinite(x)
        out = np.zeros(len(x))
        out[ok] = self.table[np.searchsorted(self.edges, x[ok], side="right")]
        return out


@dataclass(frozen=True)
class ShiftLLR:
    """``log(p0(x - shift) / p0(x))``: the post-onset law taken as the pre-fault one moved by
    ``shift`` (the difference of the medians), ``p0`` a Gaussian kernel density of the pre-fault
    samples (Silverman's bandwidth, on a grid). A slowdown multiplies a time, which moves its log:
    with thousands of pre-fault samples for the shape and tens of post-onset ones for the shift
    alone, this knows ``p1`` far better than a histogram of those tens; a fault that changes the
    shape (preemption stalls, errors) is the histogram's. Clipped to ``log(n_pre)`` either way."""

    grid: np.ndarray
    llr: np.ndarray

    @classmethod
    def fit(cls, pre: np.ndarray, post: np.ndarray, points: int = 512) -> ShiftLLR:
        pre, post = pre[np.isfinite(pre)], post[np.isfinite(post)]
        shift = float(np.median(post) - np.median(pre))
        sd = float(np.std(pre))
        iqr = float(np.subtract(*np.percentile(pre, [75, 25])))
        bw = max(0.9 * min(sd, iqr / 1.34 if iqr > 0 else sd) * len(pre) ** -0.2, 1e-6)
        lo, hi = float(pre.min()) - 4 * bw - abs(shift), float(pre.max()) + 4 * bw + abs(shift)
        grid = np.linspace(lo, hi, points)
        dens = np.zeros(points)
        for chunk in np.array_split(pre, max(1, len(pre) // 2048)):
            dens += np.exp(-0.5 * ((grid[:, None] - chunk[None, :]) / bw) ** 2).sum(axis=1)
        logp = np.log(np.maximum(dens / (len(pre) * bw * np.sqrt(2 * np.pi)), 1e-300))
        cap = math.log(len(pre) + 1.0)
        llr = np.clip(np.interp(grid - shift, grid, logp, left=logp[0], right=logp[-1]) - logp, -cap, cap)
        return cls(grid=grid, llr=llr)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        ok = np.isfinite(x)
        out = np.zeros(len(x))
        out[ok] = np.interp(x[ok], self.grid, self.llr)
        return out


def cusum_alarms(llr: np.ndarray, h: float, cap: int | None = None, start: float = 0.0) -> list[int]:
    """Indices at which Page's CUSUM ``S_n = max(0, S_{n-1} + llr_n)`` (from ``S = start``, restarted
    at 0 after each alarm) exceeds ``h``; at most ``cap``. Between restarts ``S_n = C_n - min(0, min C)``
    with ``C`` the running sum, so each stretch is scanned vectorised, :data:`SCAN_BLOCK` at a time."""
    out: list[int] = []
    n = len(llr)
    i, s0 = 0, start
    while i < n and (cap is None or len(out) < cap):
        j = min(n, i + SCAN_BLOCK)
        c = s0 + np.cumsum(llr[i:j])
        s = c - np.minimum(np.minimum.accumulate(c), 0.0)
        hit = np.flatnonzero(s > h)
        if len(hit):
            out.append(i + int(hit[0]))
            i, s0 = i + int(hit[0]) + 1, 0.0
        else:
            i, s0 = j, float(s[-1])
    return out


def cusum_max(llr: np.ndarray) -> float:
    """The largest ``S_n`` of the CUSUM without restarts (``h`` at or above it: no alarm)."""
    if not len(llr):
        return 0.0
    c = np.cumsum(llr)
    return float(np.max(c - np.minimum(np.minimum.accumulate(c), 0.0)))


def calibrate_threshold(streams: list[np.ndarray], node_hours: float, rate: float) -> tuple[float, str]:
    """``h`` at which the CUSUM raises ``rate`` alarms per node-hour on ``streams`` (healthy nodes'
    LLR samples, ``node_hours`` of them), and how it was found:

    - ``counted``: the smallest ``h`` with at most ``rate * node_hours`` alarms (bisection; the count
      only falls as ``h`` grows);
    - ``extrapolated``: fewer than one alarm is allowed in the data, so the count's tail is fitted:
      ``log(alarms) = a - theta * h`` over the ``h`` that allow 1, 2, 4 .. 64 alarms (a CUSUM's
      false-alarm rate falls exponentially in ``h``), solved at ``rate * node_hours``, and never below
      the ``h`` at which the data show no alarm at all;
    - ``wald``: no healthy alarm to fit: ``h = log(samples per node-hour / rate)``, since a CUSUM on
      the true LLR waits at least ``e^h`` samples for a false alarm.
    """
    target = rate * node_hours
    n_samples = sum(len(s) for s in streams)
    top = max((cusum_max(s) for s in streams), default=0.0) + 1e-9

    def h_allowing(k: int) -> float:
        """Smallest h (to 0.01) with at most k alarms over the streams."""

        def count(h: float) -> int:
            total = 0
            for s in streams:
                total += len(cusum_alarms(s, h, cap=k + 1 - total))
                if total > k:
                    break
            return total

        lo, hi = 0.0, top
        if count(lo) <= k:
            return lo
        while hi - lo > 0.01:
            mid = (lo + hi) / 2
            if count(mid) <= k:
                hi = mid
            else:
                lo = mid
        return hi

    if target >= 1.0:
        return h_allowing(int(target)), "counted"
    pts = [(math.log(k), h_allowing(k)) for k in (1, 2, 4, 8, 16, 32, 64)]
    pts = [(lk, h) for lk, h in pts if h > 0]
    if len(pts) >= 3 and pts[0][1] > pts[-1][1]:
        lk, hh = np.asarray([p[0] for p in pts]), np.asarray([p[1] for p in pts])
        slope, icept = np.polyfit(hh, lk, 1)  # log k = icept + slope * h, slope < 0
        if slope < 0:
            return max(top, (math.log(target) - icept) / slope), "extrapolated"
    per_hour = n_samples / node_hours if node_hours > 0 else 0.0
    return max(top, math.log(max(per_hour / rate, 1.0))), "wald"


def cusum_value(llr: np.ndarray, h: float) -> float:
    """``S`` after the last sample of ``llr`` (restarted at 0 after each alarm at ``h``)."""
    alarms = cusum_alarms(llr, h)
    rest = llr[alarms[-1] + 1:] if alarms else llr
    if not len(rest):
        return 0.0
    c = np.cumsum(rest)
    return float(c[-1] - min(0.0, float(np.min(c))))
