"""A group's learned request-cost model: ``T_total ≈ a*N_prompt + b*N_completion + c``.

Why learn it: seed 000 divides latency by ``N_prompt*w + N_completion`` with a fixed ``w``. When the
real prefill/decode cost ratio differs from ``w`` (it does, and it differs per model and GPU), the
normalised signal inherits the spread of the token counts: with the Azure conversation trace and a node
costing 0.12 ms/prompt token and 14 ms/output token, ``w = 0.25`` leaves sd(log T_norm) ≈ 0.67 across
*healthy* requests, against ≈ 0.08 with the true costs. A detector needs samples in proportion to
``(sd/shift)^2``, so that is ~60x fewer samples to see a 1.3x slowdown.

The fit minimises a Huber loss of *relative* residuals ``r_i = (y_i - ŷ_i) / ŷ_i`` by iteratively
re-weighted least squares (Huber 1964; Holland & Welsch 1977):

    w_i = min(1, k*s / |r_i|) / ŷ_i²,    s = 1.4826 * median(|r - median(r)|),   k = 1.345

Relative residuals because latency noise is multiplicative (a long request is noisier in ms); Huber
weights because a slow node's samples, or an ECC stall, must not drag the fit. Coefficients are kept
non-negative (a negative per-token cost is never physical). The same routine fits the prefill model
``TTFT ≈ a'*N_prompt + c'`` when TTFT is logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detector.baseline import robust_sd

HUBER_K = 1.345


@dataclass(frozen=True)
class CostModel:
    """Linear cost model ``y ≈ X @ coef`` (the last column of X is the constant 1)."""

    coef: np.ndarray
    residual_sd: float
    n_samples: int

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted latency (ms) for rows of ``features`` (without the constant column)."""
        return features @ self.coef[:-1] + self.coef[-1]


class Reservoir:
    """A cost model's training data: the newest ``capacity`` rows of named float columns (a ring
    buffer, so refitting on a busy group costs the same as on a quiet one)."""

    def __init__(self, columns: Sequence[str], capacity: int) -> None:
        self.columns = {c: np.zeros(capacity) for c in columns}
        self.pos = 0
        self.filled = 0

    @property
    def capacity(self) -> int:
        return len(next(iter(self.columns.values())))

    def add(self, **values: np.ndarray) -> None:
        """Append rows (one array per column, equal lengths); the oldest rows make room."""
        k = len(next(iter(values.values())))
        if k == 0:
            return
        cap = self.capacity
        skip = max(k - cap, 0)  # more rows than room: only the newest fit
        slots = (self.pos + np.arange(k - skip)) % cap
        for c, col in self.columns.items():
            col[slots] = values[c][skip:]
        self.pos = int((self.pos + k - skip) % cap)
        self.filled = int(min(self.filled + k - skip, cap))

    def rows(self) -> dict[str, np.ndarray]:
        """The filled rows of every column (in slot order, not time order)."""
        return {c: col[: self.filled] for c, col in self.columns.items()}

    def resized(self, capacity: int) -> Reservoir:
        """A copy with room for ``capacity`` rows, keeping the newest that fit."""
        order = (self.pos - self.filled + np.arange(self.filled)) % self.capacity  # oldest -> newest
        out = Reservoir(tuple(self.columns), capacity)
        out.add(**{c: col[order] for c, col in self.columns.items()})
        return out


def _design(features: np.ndarray) -> np.ndarray:
    return np.column_stack([features, np.ones(len(features))])


def _nonneg_wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with coefficients clipped at 0 (active-set, refit without clipped)."""
    sw = np.sqrt(w)
    active = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        sol, *_ = np.linalg.lstsq(x[:, active] * sw[:, None], y * sw, rcond=None)
        coef = np.zeros(x.shape[1])
        coef[active] = sol
        if (coef >= 0).all():
            return coef
        active &= coef > 0
        if not active.any():
            break
    return np.maximum(coef, 0.0)


def fit_cost_model(
    features: np.ndarray, latency_ms: np.ndarray, *, iterations: int = 8, start: CostModel | None = None
) -> CostModel | None:
    """Robustly fit ``latency ≈ features @ a + c``; ``None`` when the data cannot determine it.

    ``features``: shape (n, k) non-negative token counts; ``latency_ms``: shape (n,), positive.
    ``start``: a previous fit to start the iterations from (a refresh converges in 2-3 steps).
    """
    features = np.asarray(features, dtype=np.float64)
    if features.ndim == 1:
        features = features[:, None]
    y = np.asarray(latency_ms, dtype=np.float64)
    ok = np.isfinite(y) & (y > 0) & np.isfinite(features).all(axis=1)
    x, y = _design(features[ok]), y[ok]
    if len(y) < 3 * x.shape[1]:
        return None
    if start is not None and len(start.coef) == x.shape[1]:
        coef = start.coef.copy()
    else:
        coef = _nonneg_wls(x, y, 1.0 / y**2)
    rel = np.zeros_like(y)
    for _ in range(iterations):
        pred = np.maximum(x @ coef, 1e-9)
        rel = (y - pred) / pred
        scale = max(robust_sd(rel), 1e-6)
        huber = np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(rel), 1e-12))
        new = _nonneg_wls(x, y, huber / pred**2)
        if np.allclose(new, coef, rtol=1e-4, atol=1e-9):
            coef = new
            break
        coef = new
    if not np.any(coef[:-1] > 0) and coef[-1] <= 0:
        return None
    pred = np.maximum(x @ coef, 1e-9)
    rel = np.log(y / pred)
    resid_sd = robust_sd(rel)
    return CostModel(coef=coef, residual_sd=resid_sd, n_samples=len(y))
