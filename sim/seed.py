"""Seed 000's algorithm, the reference every policy is measured against: its rules in one place.

Per node an EMA (:data:`ALPHA`; the first sample initialises it) of :func:`t_norm`,
``total_ms / (prompt_tokens * W + completion_tokens)``. At each evaluation, the population Z of every
node over the nodes in service with more than 5 samples (at least 3 of them),
``(EMA - mean) / (sd + 1e-6)``: :func:`zscores`, which is the detector's own seed mode
(:func:`detector.baseline.seed_zscores`, ``Thresholds.baseline_mode = "seed"``): the one
implementation of the seed's Z. ``Z >= QUARANTINE_Z`` on :data:`SLOW_EVALUATIONS` consecutive
evaluations: quarantined (weight 0); ``DEGRADE_Z <= Z < QUARANTINE_Z``: :func:`weight`; under
``DEGRADE_Z`` a degraded node is restored to :data:`BASE`.

It runs in two places: :class:`sim.policies.SeedZScore` (the simulator's ``seed_zscore`` policy, with
the safeguard and the canary recovery the seed's text adds) and :class:`sim.fastmode.SeedZScoreVec`
(on arrays, for the fast mode's false-quarantine count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detector.baseline import SEED_MIN_NODES, PeerBaseline, seed_zscores

ALPHA = 0.15
W = 0.25  # a prompt token's cost against a completion token's
BASE = 100
QUARANTINE_Z = 3.5
DEGRADE_Z = 2.0
SLOW_EVALUATIONS = 3
MIN_NODES = SEED_MIN_NODES


def t_norm(prompt: Any, completion: Any, total_ms: Any) -> Any:
    """The seed's normalised latency (numbers or arrays)."""
    return total_ms / (prompt * W + completion)


def zscores(ema: np.ndarray, samples: np.ndarray, out: np.ndarray) -> PeerBaseline:
    """Every node's seed Z (NaN with 5 samples or fewer; all NaN with fewer than :data:`MIN_NODES`
    peers), the peers being the nodes not ``out`` of service with more than 5 samples."""
    return seed_zscores(ema, samples, out)


def weight(z: float) -> int:
    """A degraded node's weight: ``int(BASE * 2^-(Z - DEGRADE_Z))``, at least 1."""
    return max(1, int(BASE * 2.0 ** (-(z - DEGRADE_Z))))
