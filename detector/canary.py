"""The canary's verdict: the largest latency a probe may answer in and pass, stated once.

A probe of a quarantined node is sent at its healthy peers' load (the batch a node in service runs,
each request of their median size: ``outlier_admin.control.probe_load``) and read on the ``norm``
scale: its latency over what the group's cost model, fitted on the healthy peers' requests,
expects for its tokens (``x expected``; 1.0 = as a healthy peer answers). A group whose logs carry
no token counts has no cost model; there the probe is read on decode, its time per output token over
the peers' decode baseline, the same ``x expected`` (``detector.operator.NodeActions.probe_value``).
It passes at or under::

    limit   = min(healthy + canary_tolerance_sigma * sigma, quarantine_materiality * healthy)
    healthy = max(baseline, 1.0)      (learned normalisation; seed: baseline)
    sigma   = max(peer spread, per-request spread of healthy peers)

Why each part:

- ``healthy``: what a healthy peer answers at that load, and **never below 1.0x expected**. The
  peers' baseline can sit under 1.0 (their recent requests lighter than the fit's), and a limit
  built on it failed a healed node: 0.87x against a node that answered at 0.97x. A node faster than
  expected passes;
- ``+ tolerance * sigma``: one healthy answer's spread over that level (a probe is a handful of
  requests, not an average over minutes: judged against the spread of averages, a healthy node
  fails a third of its probes; judged against 1.0 alone, half of them);
- **never above** ``quarantine_materiality * healthy`` (1.5x by default): a latency at which the
  detector quarantines a node in service (``Thresholds.quarantine_materiality``) cannot restore one.
  A wide per-request spread (a long-tailed workload) would otherwise let a node still 2x slow at
  the peers' load pass, be restored, and be quarantined again at once.

Unknown baseline (too few peers): ``healthy`` is 1.0 in learned normalisation and the limit is
``1.0 + tolerance * spread_floor``; in seed normalisation there is no scale, the limit is NaN and no
probe passes. Pure: numpy's NaN-aware max/min over the peers' scalars, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detector.thresholds import Thresholds

#: The unit of a probe's ``norm`` and its limit in learned normalisation (seed: ms per weighted token).
UNIT_LEARNED = "x expected"
UNIT_SEED = "ms/token"


@dataclass(frozen=True)
class ProbeLimit:
    """A probe limit and how it was set: ``limit = min(raw, cap)``, ``raw = healthy + tolerance * sigma``,
    all in ``unit``."""

    limit: float
    raw: float
    healthy: float  # what a healthy peer answers at that load (>= 1.0 in learned normalisation)
    cap: float  # quarantine_materiality * healthy
    unit: str

    @property
    def bound(self) -> str:
        """``"cap"`` when the quarantine line set the limit, else ``"peers"``."""
        return "cap" if self.raw > self.cap else "peers"

    def words(self) -> str:
        """``limit 1.21x expected (healthy 1.00x + 1 sd)``: the limit and what set it."""
        if self.bound == "cap":
            return f"limit {fmt(self.limit, self.unit)} (the quarantine line)"
        return f"limit {fmt(self.limit, self.unit)} (healthy {fmt(self.healthy, self.unit)} + tolerance x sd)"


def fmt(value: float, unit: str) -> str:
    """A probe figure in its unit: ``2.70x expected`` / ``31.2 ms/token``."""
    if not np.isfinite(value):
        return "unknown"
    return f"{value:.2f}x expected" if unit == UNIT_LEARNED else f"{value:.3g} {unit}"


def probe_limit(baseline: float, spread: float, request_sd: float, t: Thresholds) -> ProbeLimit:
    """The pass limit of a probe on the ``norm`` scale from the peers' ``norm`` reference (see the
    module docstring for the rule and its reasons)."""
    learned = t.normalization == "learned"
    unit = UNIT_LEARNED if learned else UNIT_SEED
    sigma = float(np.fmax(spread, request_sd))  # fmax: a NaN on one side leaves the other
    if not (np.isfinite(baseline) and np.isfinite(sigma)):
        baseline = 1.0 if learned else float("nan")
        sigma = t.spread_floor * baseline
    healthy = float(np.fmax(baseline, 1.0)) if learned else float(baseline)
    raw = float(healthy + t.canary_tolerance_sigma * sigma)
    cap = t.quarantine_materiality * healthy
    limit = float(np.fmin(raw, cap)) if np.isfinite(raw) else float("nan")
    return ProbeLimit(limit, raw, healthy, cap, unit)
