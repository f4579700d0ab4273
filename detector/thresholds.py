"""Per-group detector configuration: one validated, immutable object.

Every number the detector uses lives here, with the seeds' defaults and a documented range. A value
outside its range raises :class:`ThresholdError` naming the field and the range, so an operator who
types ``quarantine_z=1`` into a form learns why it was refused instead of quarantining half a fleet.

Defaults and where they come from:

- ``ema_alpha = 0.15`` (seed 000: "0.15-0.2 filters single hiccups but notices 5-8 slow requests").
- ``ema_clip = 4`` is ours: the per-sample clip of the EMA input (no single record moves a node far).
- ``degrade_z = 2.0``, ``quarantine_z = 3.5``, ``quarantine_persistence = 10`` samples (seed 000; seed
  mode). Robust mode states persistence in time: ``quarantine_persistence_s = 1.0`` s of samples at
  quarantine strength (ours; over twice a node-wide stall, see the field), with
  ``quarantine_min_evaluations = 3`` evaluations as its sample floor.
- ``window_size = 1000``, ``tail_min_samples = 100``, ``tail_ratio = 3.0``, ``tail_windows = 3`` of
  ``tail_window_s = 30`` s, ``cross_p50_ratio = 2.0`` (seed 001).
- ``consecutive_errors = 5``, ``success_rate_stdev = 1.9``, ``success_rate_min_hosts = 5``,
  ``success_rate_min_requests = 100`` (Envoy outlier detection defaults).
- ``max_quarantine_fraction = 0.30`` (seed 000's safeguard).
- ``spread_floor`` and the two ``materiality`` ratios are ours: they keep a very uniform group from
  turning a 1% difference into a huge Z (see :mod:`detector.baseline`).
- ``degrade_evidence = 8`` and ``evidence_allowance = 0.5`` (per-request sd) are ours: the CUSUM that
  gates a weight cut (:mod:`detector.evidence`). In the simulator's healthy 64-node hour they took
  false weight cuts from 2,778 to 13 while the seed drill's throttled nodes were still cut within
  1.4-2.8 s.
- ``queue_drain_s = 10`` is ours: without TTFT, latency quarantines a node only on requests dispatched
  this long after its weight cut (the same hour without TTFT: 173 false quarantines before, 0 after).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

#: The ejecting detectors by reason code, in the ejection layer's priority order (errors first: they
#: are unambiguous). ``dry_run`` names a subset.
DETECTORS: tuple[str, ...] = ("consecutive_errors", "success_rate", "z_quarantine", "tail_ratio", "cross_p50")


class ThresholdError(ValueError):
    """An invalid threshold value. ``field`` names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def _rng(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False, integer: bool = False):
    """Range metadata for a field: stored in ``dataclasses.field(metadata=...)``."""
    return {"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "integer": integer}


def _f(default: Any, **rng: Any) -> Any:
    return field(default=default, metadata={"range": _rng(**rng)})


@dataclass(frozen=True)
class Thresholds:
    """All tunables of one model group's detector. Construct, :meth:`replace` or :meth:`from_dict`."""

    # --- signals -----------------------------------------------------------------------------------
    normalization: Literal["learned", "seed"] = "learned"
    """``learned``: latency / the group's robustly fitted cost model. ``seed``: seed 000's fixed weight."""
    seed_prompt_weight: float = _f(0.25, lo=0.0, hi=1.0)
    """w in ``T_norm = T_total / (N_prompt*w + N_completion)`` (seed normalisation)."""
    cost_model_min_samples: int = _f(200, lo=20, hi=1_000_000, integer=True)
    """Samples of healthy nodes needed before the cost model is fitted and ``norm`` is judged."""
    cost_model_refit_s: float = _f(2.0, lo=0.0, hi=3600.0)
    """Refit the cost model at most this often (it drifts over minutes; a tick is 0.2-1 s)."""
    cost_model_reservoir: int = _f(4096, lo=100, hi=1_000_000, integer=True)
    """Most recent healthy samples kept for the cost-model fit."""
    decode_batch_curve: bool = True
    """Compare decode times at the group's median batch where model servers report their running
    batch (:mod:`detector.signals`): a busier healthy node is not slower."""

    # --- per-node statistics ---------------------------------------------------------------------
    ema_alpha: float = _f(0.15, lo=0.0, hi=1.0, lo_open=True)
    ema_clip: float = _f(4.0, lo=1.5, hi=1000.0)
    """A sample enters a node's EMA clipped to ``[baseline / c, baseline * c]`` of its signal (the
    group's last peer baseline): one record, however extreme, moves the EMA by at most
    ``alpha * (c - 1)`` baselines (0.45 at the defaults, under the 1.5x quarantine line), while a node
    4x slower than its peers is already as far out as any decision needs."""
    min_samples: int = _f(5, lo=1, hi=100_000, integer=True)
    """A node is judged once it has more than this many samples of a signal (seed: > 5)."""
    window_size: int = _f(1000, lo=100, hi=100_000, integer=True)
    stale_after_s: float = _f(120.0, lo=1.0, hi=86_400.0)
    """A node with no sample for this long is not judged and not part of the baseline."""

    # --- peer baseline and Z ---------------------------------------------------------------------
    baseline_mode: Literal["robust", "seed"] = "robust"
    min_peers: int = _f(3, lo=2, hi=10_000, integer=True)
    spread_floor: float = _f(0.05, lo=0.0, hi=1.0)
    """Robust mode: ``spread >= spread_floor * baseline`` (relative floor on the peer spread)."""
    degrade_materiality: float = _f(1.15, lo=1.0, hi=100.0)
    """Robust mode: no weight cut unless ``EMA >= degrade_materiality * baseline``. Healthy peers
    differ by 3-6% (sd), so the slowest of 64 healthy nodes sits ~10-15% above the median."""
    quarantine_materiality: float = _f(1.5, lo=1.0, hi=100.0)
    """Robust mode: no quarantine unless ``EMA >= quarantine_materiality * baseline``. Milder
    slowdowns are drained by the degrade weight (Z = 6 -> 1/16 of base) without leaving service."""
    degrade_z: float = _f(2.0, lo=0.5, hi=50.0)
    degrade_hysteresis: float = _f(0.5, lo=0.0, hi=10.0)
    """A degraded node returns to healthy once ``Z < degrade_z - degrade_hysteresis`` (no flapping)."""
    quarantine_z: float = _f(3.5, lo=0.5, hi=100.0)
    degrade_persistence: int = _f(3, lo=1, hi=100_000, integer=True)
    """The fewest samples that can cut a node's weight (immediate at quarantine strength)."""
    degrade_evidence: float = _f(8.0, lo=0.5, hi=10_000.0)
    """Robust mode: a weight cut also needs the node's CUSUM of per-request excess over
    ``degrade_materiality`` (in per-request sd) to reach this line (:mod:`detector.evidence`)."""
    evidence_allowance: float = _f(0.5, lo=0.0, hi=100.0)
    """Robust mode: per-request allowance ``k`` of that CUSUM (sd): a node must be this far above the
    materiality line on average to accumulate evidence."""
    quarantine_persistence: int = _f(10, lo=1, hi=100_000, integer=True)
    """Seed mode (and robust mode with ``quarantine_persistence_s = 0``): samples (counted at each
    evaluation) with ``Z >= quarantine_z`` before quarantine; a leaky count: each sample under the
    line takes one back."""
    quarantine_persistence_s: float = _f(1.0, lo=0.0, hi=600.0)
    """Robust mode: seconds the deciding signal must stay at quarantine strength before quarantine,
    measured on the node's own samples (a leaky time: a tick whose samples fall back under the line
    takes its time back; 0: count ``quarantine_persistence`` samples instead). What tells a
    sustained fault from a node-wide stall is its duration: a host hiccup, a GC pause, an ECC replay
    burst stop every stream for well under a second, a throttled or degraded GPU stays slow. A
    count of samples is a different time at every cadence (10 requests of a busy node arrive in
    50 ms; 10 progress rows take 2.5 s at 250 ms scrapes, 10 s at 1 s), so the duration is stated
    in seconds and the cadence only sets how finely it is measured. Held time counts only while the
    node's new samples themselves are over the quarantine line (not only its EMA, which a 0.4 s stall
    keeps over it for about a second after the stall ended). At 1.0 s, over twice a 0.4 s stall: the
    seed drill's 3x throttle is quarantined ~1.3-1.8 s after onset at 250 ms scrapes, and the
    simulator's periodic 0.4 s stall (``periodic-stall-16``) is never quarantined. The range stops
    at 600 s (a longer hold is no longer detection)."""
    queue_drain_s: float = _f(10.0, lo=0.0, hi=3600.0)
    """Robust mode, gateway logs no TTFT (the latency includes the queue): quarantine counts only
    requests dispatched this long after the node's weight was cut, when its queue has drained."""
    quarantine_min_evaluations: int = _f(3, lo=1, hi=10_000, integer=True)
    """...seen over the line at this many evaluations with new samples (seed 000: 3 evaluations): the
    sample floor of the time rule (one slow sample of a node that reports rarely covers a long time)."""
    min_weight_fraction: float = _f(0.05, lo=0.0, hi=1.0, lo_open=True)
    """Floor of a degraded / pending node's weight, as a fraction of base: it keeps being sampled."""

    # --- tail ratio (seed 001) and cross-node P50 ---------------------------------------------------
    tail_min_samples: int = _f(100, lo=10, hi=100_000, integer=True)
    tail_ratio: float = _f(3.0, lo=1.0, hi=1000.0, lo_open=True)
    tail_windows: int = _f(3, lo=1, hi=1000, integer=True)
    tail_window_s: float = _f(30.0, lo=1.0, hi=3600.0)
    cross_p50_ratio: float = _f(2.0, lo=1.0, hi=1000.0, lo_open=True)

    # --- errors (Envoy outlier detection semantics) ------------------------------------------------
    consecutive_errors: int = _f(5, lo=1, hi=100_000, integer=True)
    success_rate_stdev: float = _f(1.9, lo=0.0, hi=100.0)
    success_rate_min_hosts: int = _f(5, lo=1, hi=100_000, integer=True)
    success_rate_min_requests: int = _f(100, lo=1, hi=10_000_000, integer=True)
    error_interval_s: float = _f(10.0, lo=0.1, hi=3600.0)

    # --- warm-up (slow start) --------------------------------------------------------------------
    warmup_samples: int = _f(50, lo=0, hi=1_000_000, integer=True)
    """A new or re-joined node is not judged (and not in the baseline) until it has this many samples."""
    warmup_min_weight_fraction: float = _f(0.10, lo=0.0, hi=1.0, lo_open=True)
    """Slow start: weight ramps linearly from this fraction of base to base over the warm-up."""

    # --- canary probes and recovery ---------------------------------------------------------------
    canary_interval_s: float = _f(10.0, lo=0.1, hi=3600.0)
    canary_passes: int = _f(3, lo=1, hi=100, integer=True)
    canary_tolerance_sigma: float = _f(1.0, lo=0.0, hi=100.0)
    recovery_steps: tuple[float, ...] = (0.25, 0.5, 1.0)
    recovery_step_s: float = _f(10.0, lo=0.1, hi=3600.0)
    backoff_cap_s: float = _f(300.0, lo=0.1, hi=86_400.0)
    """Each re-quarantine doubles the probe interval (Envoy ejection backoff) up to this cap."""

    # --- group level -------------------------------------------------------------------------------
    max_quarantine_fraction: float = _f(0.30, lo=0.0, hi=1.0)
    require_approval: bool = False
    """Group policy ``approval``: the detector proposes, a human approves (``pending_approval``)."""
    dry_run: tuple[str, ...] = ()
    """Detectors (by reason code, :data:`DETECTORS`) whose verdicts are recorded but not acted on
    (Envoy's ``enforcing_*`` at 0%): try a detector on a live group before trusting it."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            rng = f.metadata.get("range")
            if rng is not None:
                self._check_range(f.name, getattr(self, f.name), rng)
        if self.normalization not in ("learned", "seed"):
            raise ThresholdError("normalization", "must be 'learned' or 'seed'")
        if self.baseline_mode not in ("robust", "seed"):
            raise ThresholdError("baseline_mode", "must be 'robust' or 'seed'")
        if not isinstance(self.decode_batch_curve, bool):
            raise ThresholdError("decode_batch_curve", "must be true or false")
        if not isinstance(self.require_approval, bool):
            raise ThresholdError("require_approval", "must be true or false")
        if self.quarantine_z <= self.degrade_z:
            raise ThresholdError(
                "quarantine_z", f"must be greater than degrade_z ({self.degrade_z}), got {self.quarantine_z}"
            )
        if self.quarantine_materiality < self.degrade_materiality:
            raise ThresholdError("quarantine_materiality", "must be >= degrade_materiality")
        if self.tail_min_samples > self.window_size:
            raise ThresholdError("tail_min_samples", f"must be <= window_size ({self.window_size})")
        steps = tuple(self.recovery_steps)
        if (
            not steps
            or any(not isinstance(s, int | float) or not 0 < s <= 1 for s in steps)
            or list(steps) != sorted(steps)
            or steps[-1] != 1.0
        ):
            raise ThresholdError(
                "recovery_steps", "must be increasing fractions in (0, 1] ending at 1.0, e.g. [0.25, 0.5, 1.0]"
            )
        object.__setattr__(self, "recovery_steps", tuple(float(s) for s in steps))
        if not isinstance(self.dry_run, list | tuple) or not all(d in DETECTORS for d in self.dry_run):
            raise ThresholdError("dry_run", f"must be a list of detectors among {', '.join(DETECTORS)}")
        object.__setattr__(self, "dry_run", tuple(sorted(set(self.dry_run))))

    @staticmethod
    def _check_range(name: str, value: Any, rng: dict[str, Any]) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ThresholdError(name, f"must be a number in {Thresholds._describe(rng)}, got {value!r}")
        if isinstance(value, int) and abs(value) > 2**63:
            raise ThresholdError(name, f"must be in {Thresholds._describe(rng)}, got an integer of {len(str(value))} digits")
        if rng["integer"] and not float(value).is_integer():
            raise ThresholdError(name, f"must be an integer in {Thresholds._describe(rng)}, got {value!r}")
        if not math.isfinite(value):
            raise ThresholdError(name, f"must be finite, got {value!r}")
        lo, hi = rng["lo"], rng["hi"]
        too_low = value <= lo if rng["lo_open"] else value < lo
        too_high = value >= hi if rng["hi_open"] else value > hi
        if too_low or too_high:
            raise ThresholdError(name, f"must be in {Thresholds._describe(rng)}, got {value!r}")

    @staticmethod
    def _describe(rng: dict[str, Any]) -> str:
        left = "(" if rng["lo_open"] else "["
        right = ")" if rng["hi_open"] else "]"
        kind = "integer " if rng["integer"] else ""
        return f"{kind}{left}{rng['lo']:g}, {rng['hi']:g}{right}"

    @classmethod
    def field_ranges(cls) -> dict[str, str]:
        """Human-readable allowed range of every field (for forms and API docs)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            rng = f.metadata.get("range")
            if rng is not None:
                out[f.name] = cls._describe(rng)
        out["normalization"] = "'learned' | 'seed'"
        out["baseline_mode"] = "'robust' | 'seed'"
        out["recovery_steps"] = "increasing fractions in (0, 1] ending at 1.0"
        out["require_approval"] = "true | false"
        out["decode_batch_curve"] = "true | false"
        out["dry_run"] = "list of " + " | ".join(DETECTORS)
        return out

    def replace(self, **changes: Any) -> Thresholds:
        """A validated copy with ``changes`` applied (unknown names raise :class:`ThresholdError`)."""
        return Thresholds.from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recovery_steps"] = list(self.recovery_steps)
        d["dry_run"] = list(self.dry_run)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Thresholds:
        """Build from a JSON-like dict; unknown keys are refused (a typo must not pass silently)."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise ThresholdError(key, "unknown threshold")
        kwargs = dict(data)
        if "recovery_steps" in kwargs:
            steps = kwargs["recovery_steps"]
            if not isinstance(steps, list | tuple):
                raise ThresholdError("recovery_steps", "must be a list of fractions")
            kwargs["recovery_steps"] = tuple(steps)
        if "dry_run" in kwargs:
            dry = kwargs["dry_run"]
            if not isinstance(dry, list | tuple):
                raise ThresholdError("dry_run", f"must be a list of detectors among {', '.join(DETECTORS)}")
            kwargs["dry_run"] = tuple(dry)
        for f in dataclasses.fields(cls):
            rng = f.metadata.get("range")
            if rng is not None and f.name in kwargs and rng["integer"]:
                v = kwargs[f.name]
                if isinstance(v, float) and v.is_integer():
                    kwargs[f.name] = int(v)
        return cls(**kwargs)
