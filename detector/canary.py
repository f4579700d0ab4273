"""The canary's verdict: the largest latency a probe may answer in and pass, stated once.

A probe of a quarantined node is sent at its healthy peers' load (the batch a node in service runs,
each request of their median size: ``outlier_admin.control.probe_load``) and read on the ``norm``
scale: its latency over what the group's cost model, fitted on the healthy peers' requests,
expects for its tokens (``x expected``; 1.0 = as a healthy peer answers). It passes at or under::

    limit = clip(baseline + canary_tolerance_sigma * sigma,
                 healthy, quarantine_materiality * healthy)
    healthy = max(baseline, 1.0)      (learned normalisation; seed: baseline)
    sigma   = max(peer spread, per-request spread of healthy peers)

Why each part:

- ``baseline + tolerance * sigma``: the peers' ``norm`` now, plus the spread of one healthy answer
  (a probe is a handful of requests, not an average over minutes: judged against the spread of
  averages a healthy node fails a third of its probes);
- **never below** ``healthy``: the limit is never under what a healthy peer answers at that load.
  The cost model says 1.0 for a healthy peer; the peers' baseline can sit under it (their recent
  requests were lighter than the fit's), and a limit of 0.87x then failed a healed node that
  answered at 0.97x — a node faster than expected passes;
- **never above** ``quarantine_materiality * healthy`` (1.5x by default): a latency at which the
  detector quarantines a node in service (``Thresholds.quarantine_materiality``) cannot restore one.
  A wide per-request spread (a long-tailed workload) would otherwise let a node still 2x slow at
  the peers' load pass, be restored, and be quarantined again at once.

Unknown baseline (too few peers): ``healthy`` is 1.0 in learned normalisation and the limit is
``1.0 + tolerance * spread_floor``; in seed normalisation there is no scale, the limit is NaN and no
probe passes. Pure numpy: scalars or arrays (one limit per node)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detector.thresholds import Thresholds

#: The unit of a probe's ``norm`` and its limit in learned normalisation (seed: ms per weighted token).
UNIT_LEARNED = "x expected"
UNIT_SEED = "ms/token"


@dataclass(frozen=True)
class ProbeLimit:
    """A probe limit and how it was set: ``limit`` = ``clip(raw, floor, cap)``, in ``unit``."""

    limit: float
    raw: float  # baseline + tolerance * sigma
    floor: float  # what a healthy peer answers
    cap: float  # quarantine_materiality * floor
    unit: str

    @property
    def bound(self) -> str:
        """Which part set the limit: ``"peers"`` (baseline + tolerance x sd), ``"floor"`` or ``"cap"``."""
        if self.limit == self.floor and self.raw < self.floor:
            return "floor"
        if self.limit == self.cap and self.raw > self.cap:
            return "cap"
        return "peers"

    def words(self) -> str:
        """``limit 1.14x expected (peers 0.93 + 1 sd)`` style: the limit and the part that set it."""
        why = {"peers": "peer baseline + tolerance x sd",
               "floor": "never below a healthy peer",
               "cap": "never above the quarantine line"}[self.bound]
        return f"limit {fmt(self.limit, self.unit)} ({why})"


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
    raw = float(baseline + t.canary_tolerance_sigma * sigma)
    cap = t.quarantine_materiality * healthy
    limit = float(np.clip(raw, healthy, cap)) if np.isfinite(raw) else float("nan")
    return ProbeLimit(limit, raw, healthy, cap, unit)
