"""Precomputed workload: every request of a scenario, built once and shared by all policies.

Arrivals run until ``duration_s`` at the configured rate. With a ``trace``, the trace's inter-arrival
gaps (its burstiness) are rescaled so the mean of the gaps used is ``1/rate_rps``; the trace is
cycled, each cycle starting at a random rotation, when the run needs more requests than it holds. Without a trace, arrivals are Poisson. ``rate_profile`` steps
``[[t0, m0], [t1, m1], ...]`` are applied by time warping: arrivals are generated on the unit-rate
clock ``s`` and mapped through the inverse of the cumulative intensity
``Λ(t) = ∫_0^t m(u) du`` (piecewise linear), so a multiplier of 2 doubles the rate from ``t_i`` on
while keeping the trace's shape.

Token counts come from the trace rows in arrival order (prompt and completion stay paired), clipped to
the scenario's ``max``; without a trace they are ``round(median * exp(sigma * N(0,1)))`` in [1, max].

Per-request randomness (noise, ECC draws) is drawn here too, so every policy sees identical requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scenario import Scenario, TokenDist
from sim.scenario import Workload as WorkloadSpec
from sim.traces import load_trace


@dataclass(frozen=True)
class Requests:
    """Column arrays of all client requests, sorted by arrival time."""

    t: np.ndarray  # arrival time, s
    group: np.ndarray  # group index (int64)
    prompt: np.ndarray  # prompt tokens (int64)
    completion: np.ndarray  # completion tokens (int64)

    def __len__(self) -> int:
        return len(self.t)


def warp_times(s: np.ndarray, profile: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Map unit-rate times ``s`` to real times ``t = Λ^{-1}(s)`` for a step ``rate_profile``.

    Before the first step the multiplier is the first step's value.
    """
    if len(profile) == 1 and profile[0][1] == 1.0:
        return s
    knots_t = [0.0]
    knots_s = [0.0]
    mults = [profile[0][1]]
    for t_i, m_i in profile:
        if t_i <= 0:
            mults[0] = m_i
            continue
        knots_s.append(knots_s[-1] + (t_i - knots_t[-1]) * mults[-1])
        knots_t.append(t_i)
        mults.append(m_i)
    knots_t_a = np.asarray(knots_t)
    knots_s_a = np.asarray(knots_s)
    idx = np.searchsorted(knots_s_a, s, side="right") - 1
    return knots_t_a[idx] + (s - knots_s_a[idx]) / np.asarray(mults)[idx]


def _lognormal_tokens(rng: np.random.Generator, d: TokenDist, n: int) -> np.ndarray:
    x = np.rint(d.median * np.exp(d.sigma * rng.standard_normal(n)))
    return np.clip(x, 1, d.max).astype(np.int64)


def warp_inverse(t: float, profile: tuple[tuple[float, float], ...]) -> float:
    """``Λ(t)``: unit-rate time elapsed by real time ``t``."""
    s = 0.0
    steps = list(profile)
    for i, (t_i, m_i) in enumerate(steps):
        t_next = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        lo = 0.0 if i == 0 else t_i
        if t <= lo:
            break
        s += (min(t, t_next) - lo) * m_i
    return s


def build_group_requests(spec: WorkloadSpec, duration_s: float, rng: np.random.Generator
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t, prompt, completion)`` of one workload entry over ``[0, duration_s)``.

    On the unit-rate clock the run lasts ``s_end = Λ(duration_s) * rate_rps``. Poisson: exponential
    gaps are drawn until their sum passes ``s_end``. Trace: ``n = ceil(s_end)`` consecutive gaps from a
    random rotation are rescaled so that *their own* sum is ``s_end`` (normalising by the whole trace's
    mean gap instead made a busy slice of the trace run above the configured rate and run out of
    requests before the end); the rate over the run is then exactly ``rate_rps``, the shape the
    trace's.
    """
    s_end = warp_inverse(duration_s, spec.rate_profile) * spec.rate_rps  # expected requests
    if spec.trace:
        gaps, p, c = load_trace(spec.trace)
        n_tr = len(gaps)
        n_need = max(1, int(np.ceil(s_end)))
        cycles = -(-n_need // n_tr)
        # Each cycle starts at a random rotation so long runs do not replay one hour in lock step.
        idx = np.concatenate([np.roll(np.arange(n_tr), -int(rng.integers(n_tr))) for _ in range(cycles)])[:n_need]
        unit_gaps = gaps[idx] * (s_end / gaps[idx].sum())
        prompt = np.clip(p[idx], 1, spec.prompt_tokens.max)
        completion = np.clip(c[idx], 1, spec.completion_tokens.max)
    else:
        chunks = [rng.exponential(1.0, int(s_end + 6 * np.sqrt(s_end) + 16))]
        total = float(chunks[0].sum())
        while total <= s_end:  # rare (> 6 sd short): draw more until the run is covered
            chunks.append(rng.exponential(1.0, int(np.sqrt(s_end) + 16)))
            total += float(chunks[-1].sum())
        unit_gaps = np.concatenate(chunks)
        prompt = _lognormal_tokens(rng, spec.prompt_tokens, len(unit_gaps))
        completion = _lognormal_tokens(rng, spec.completion_tokens, len(unit_gaps))
    # Random phase for the first arrival so groups sharing a trace are not synchronised: the first
    # gap is shortened by a uniform fraction (the arrivals stay inside the run).
    s = (np.cumsum(unit_gaps) - unit_gaps[0] * rng.random()) / spec.rate_rps
    t = warp_times(s, spec.rate_profile)
    keep = t < duration_s
    return t[keep], prompt[keep], completion[keep]


def build_requests(scn: Scenario, rng: np.random.Generator | None = None) -> Requests:
    """All client requests of a scenario, merged across groups and sorted by arrival time."""
    rng = rng or np.random.default_rng([scn.seed, 1])
    names = [g.name for g in scn.groups]
    ts, gs, ps, cs = [], [], [], []
    for spec in scn.workload:
        t, p, c = build_group_requests(spec, scn.duration_s, rng)
        ts.append(t)
        ps.append(p)
        cs.append(c)
        gs.append(np.full(len(t), names.index(spec.group), dtype=np.int64))
    t = np.concatenate(ts)
    order = np.argsort(t, kind="stable")
    return Requests(t=t[order], group=np.concatenate(gs)[order], prompt=np.concatenate(ps)[order],
                    completion=np.concatenate(cs)[order])
