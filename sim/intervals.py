"""95 % confidence intervals of the figures the simulator publishes (``scipy.stats``).

- A proportion (precision, recall: ``k`` of ``n``): the **Wilson score interval**, which stays inside
  [0, 1] and keeps its coverage near 0 and 1, where a suite's precision and recall sit (the normal
  approximation gives [1, 1] for 20 of 20).
- A rate (false cuts per 1,000 healthy node-hours: ``k`` events in ``exposure`` node-hours): the exact
  **Poisson (Garwood) interval** from the chi-square quantiles, ``[chi2(a/2; 2k) / 2, chi2(1 - a/2;
  2k + 2) / 2] / exposure``: with no event its upper end is 3.69 / exposure (two-sided 95 %), which
  is what a run with few healthy node-hours can say.
"""

from __future__ import annotations

import math

CONFIDENCE = 0.95


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval of the proportion ``k / n`` (``None`` when ``n`` is 0)."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def garwood(k: int, exposure: float, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Exact Poisson interval of the rate ``k / exposure`` (``None`` when there is no exposure)."""
    if not exposure > 0 or not math.isfinite(exposure):
        return None
    from scipy.stats import chi2

    a = 1.0 - confidence
    low = 0.0 if k == 0 else float(chi2.ppf(a / 2, 2 * k)) / 2
    high = float(chi2.ppf(1 - a / 2, 2 * k + 2)) / 2
    return low / exposure, high / exposure


def rate_per_1000h(k: int, node_hours: float, confidence: float = CONFIDENCE) -> dict[str, float | int | None]:
    """``k`` events in ``node_hours``: the rate per 1,000 node-hours with its Garwood interval."""
    ci = garwood(k, node_hours, confidence)
    return {"events": int(k), "node_hours": round(float(node_hours), 4),
            "per_1000h": round(1000.0 * k / node_hours, 3) if node_hours > 0 else None,
            "ci95": None if ci is None else [round(1000.0 * ci[0], 3), round(1000.0 * ci[1], 3)]}


def proportion(k: int, n: int, confidence: float = CONFIDENCE) -> dict[str, float | int | None]:
    """``k`` of ``n`` with its Wilson interval."""
    ci = wilson(k, n, confidence)
    return {"k": int(k), "n": int(n), "value": round(k / n, 4) if n else None,
            "ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)]}
