"""Peer baseline and Z-score of every node of a group.

Two modes.

``seed`` — seed 000 exactly: over the *eligible* nodes (not quarantined, more than 5 samples; at
least 3 of them), the population mean and standard deviation of their EMAs, and
``Z_i = (EMA_i - mean) / (std + 1e-6)``.

That formula has two flaws, which is why it is not our default:

1. **It cannot see an outlier in a small group.** The outlier is part of the mean and std it is
   compared with. By Samuelson's inequality (1968), for any M values with population std,
   ``(x_i - mean) / std <= sqrt(M - 1)``. So with M = 13 nodes, Z can never exceed sqrt(12) = 3.46 < 3.5:
   the seed never quarantines anything in a group of fewer than 14 nodes, however slow, and never even
   degrades (Z = 2) in a group of fewer than 5 — one node 10x slower among 13 gives exactly Z = 3.46.
2. **It explodes in a uniform group.** With only ``+1e-6`` in the denominator, nodes that agree to
   0.1% turn a 1% difference into Z ≈ 10 — a quarantine of a perfectly healthy node.

``robust`` (default) — the baseline is the median of the eligible EMAs and the spread is
``max(1.4826 * MAD, spread_floor * baseline)``:

    Z_i = (EMA_i - median_j EMA_j) / max(1.4826 * median_j |EMA_j - median|, r * median)

The median and MAD have a 50% breakdown point, so the slow node (or several) does not hide itself by
inflating the spread; a slow node among 8 gets Z in the dozens. The relative floor ``r`` says "peers
closer than r are the same": real fleets differ by 3-6% between healthy machines (Azure VM-noise
data: sd(log latency) 0.03-0.19), so a 1% difference is never an outlier. The state machine adds a
*materiality* floor on ``EMA / baseline`` on top (see :mod:`detector.group`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAD_TO_SD = 1.4826
SEED_MIN_SAMPLES = 5
SEED_MIN_NODES = 3
SEED_EPSILON = 1e-6


@dataclass(frozen=True)
class PeerBaseline:
    """Result for one signal: per-node Z (NaN where not judged), the baseline and the spread."""

    z: np.ndarray
    baseline: float
    spread: float
    peers: int


def robust_sd(x: np.ndarray) -> float:
    """The robust spread of ``x``: ``1.4826 * median(|x - median(x)|)`` (the median absolute deviation,
    scaled to equal the standard deviation of normally distributed values; breakdown point 50%: a
    minority of outliers does not inflate it). ``x`` must not be empty."""
    return MAD_TO_SD * float(np.median(np.abs(x - np.median(x))))


def _nan_result(n: int, peers: int) -> PeerBaseline:
    return PeerBaseline(z=np.full(n, np.nan), baseline=float("nan"), spread=float("nan"), peers=peers)


def seed_zscores(ema: np.ndarray, count: np.ndarray, quarantined: np.ndarray) -> PeerBaseline:
    """Seed 000's population Z over non-quarantined nodes with more than 5 samples."""
    eligible = ~quarantined & (count > SEED_MIN_SAMPLES)
    peers = int(eligible.sum())
    if peers < SEED_MIN_NODES:
        return _nan_result(len(ema), peers)
    mean = float(ema[eligible].mean())
    std = float(ema[eligible].std())  # population std, as the seed
    z = np.where(count > SEED_MIN_SAMPLES, (ema - mean) / (std + SEED_EPSILON), np.nan)
    return PeerBaseline(z=z, baseline=mean, spread=std, peers=peers)


def robust_zscores(
    ema: np.ndarray, judged: np.ndarray, eligible: np.ndarray, *, min_peers: int, spread_floor: float
) -> PeerBaseline:
    """Median/MAD Z with a relative spread floor.

    ``eligible``: nodes that form the baseline (healthy or degraded, warmed up, enough samples, fresh).
    ``judged``: nodes that get a Z (enough samples, fresh) — includes nodes outside the baseline.
    """
    peers = int(eligible.sum())
    if peers < min_peers:
        return _nan_result(len(ema), peers)
    values = ema[eligible]
    baseline = float(np.median(values))
    spread = max(robust_sd(values), spread_floor * abs(baseline), 1e-12)
    z = np.where(judged, (ema - baseline) / spread, np.nan)
    return PeerBaseline(z=z, baseline=baseline, spread=spread, peers=peers)


_FIELDS = ("baseline", "spread", "request_sd", "request_rel_sd", "row_rel_sd", "pool_rel_sd")


@dataclass
class Reference:
    """What a signal's later samples are judged against, as the last evaluation (or batch) left it;
    NaN until known. ``baseline``/``spread``: the peers' (:func:`robust_zscores`); ``request_sd``
    (``norm`` only) and ``request_rel_sd``: the healthy peers' per-request spread, absolute and
    relative; ``row_rel_sd`` / ``pool_rel_sd``: the relative spread of progress rows and of pooled
    per-batch means (EW-averaged across batches)."""

    baseline: float = math.nan
    spread: float = math.nan
    request_sd: float = math.nan
    request_rel_sd: float = math.nan
    row_rel_sd: float = math.nan
    pool_rel_sd: float = math.nan

    def rel_sd(self, kind: str) -> float:
        """The relative spread of ``kind`` (``row_rel_sd``, ``pool_rel_sd``) once one is known, else
        the per-request one."""
        value = getattr(self, kind)
        return self.request_rel_sd if math.isnan(value) else value


class References:
    """Every signal's :class:`Reference` (a group detector's, kept in its snapshot)."""

    def __init__(self) -> None:
        self._by_signal: dict[str, Reference] = {}

    def of(self, signal: str) -> Reference:
        """``signal``'s reference (all NaN when nothing is known of it yet), to read: a write to an
        unknown signal's goes nowhere (:meth:`at` is for writing)."""
        ref = self._by_signal.get(signal)
        # A fresh one, never a shared default: a write to a shared one set every group's unknown
        # baseline (a test that did was seen by the next test in the same process).
        return Reference() if ref is None else ref

    def at(self, signal: str) -> Reference:
        """``signal``'s reference, to write into."""
        ref = self._by_signal.get(signal)
        if ref is None:
            ref = self._by_signal[signal] = Reference()
        return ref

    def to_dict(self) -> dict[str, float]:
        """``{"<field>:<signal>": value}`` of every known value (the snapshot's layout)."""
        return {f"{name}:{s}": getattr(ref, name) for s, ref in self._by_signal.items() for name in _FIELDS
                if not math.isnan(getattr(ref, name))}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> References:
        """From :meth:`to_dict`'s layout (keys it does not know, from older snapshots, are ignored)."""
        out = cls()
        for key, value in data.items():
            name, _, signal = key.partition(":")
            if name in _FIELDS and signal:
                setattr(out.at(signal), name, float(value))
        return out

