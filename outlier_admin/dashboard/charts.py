"""The node page's charts, built from the timeline (:mod:`outlier_admin.api.timeline`)."""

from __future__ import annotations

from datetime import datetime

from django.utils.safestring import SafeString

from detector.thresholds import Thresholds
from outlier_admin.api.timeline import BaselinePoint, Point
from outlier_admin.control.models import Transition
from outlier_admin.dashboard.svg import PALETTE, Marker, Series, Threshold, time_chart

MARKER_COLORS = {"quarantined": "#c62828", "degraded": "#b85c00", "healthy": "#2e7d32"}


def node_charts(
    points: list[Point], baseline: list[BaselinePoint], transitions: list[Transition],
    thresholds: Thresholds, start: datetime, end: datetime, *, signal: str = "norm",
    tail_points: list[Point] | None = None, evidence_points: list[Point] | None = None,
) -> dict[str, SafeString]:
    """``{"z", "ema", "weight", "tail", "evidence"}`` SVG charts for one node over ``[start, end]``.

    ``tail_points`` (the norm rows, which carry the tail window) and ``evidence_points`` (the rows of
    the signal the detector decides on, which carry the evidence) default to ``points``.

    The EMA chart draws the group's stored detector baseline and the degrade bound
    ``baseline + degrade_z * spread`` (where the node's EMA crosses it, its Z crosses ``degrade_z``)."""
    markers = [Marker(t.at, f"{t.at:%H:%M:%S} {t.from_state} -> {t.to_state} ({t.reason})",
                      MARKER_COLORS.get(t.to_state, "#444")) for t in transitions]
    ats = [p.at for p in points]
    # "learned" normalisation divides latency by the group's cost model (a ratio, 1.0 = as expected);
    # "seed" divides by weighted tokens (ms per token).
    ratio_unit = "ms/token" if thresholds.normalization == "seed" else "x expected"
    unit = "ms/token" if signal == "decode" else ratio_unit
    ema_title = {"decode": "Decode time per token", "prefill": "Time to first token (normalised)"}.get(
        signal, "Normalised latency")
    tail_points = points if tail_points is None else tail_points
    tail_ats = [p.at for p in tail_points]
    evidence_points = points if evidence_points is None else evidence_points
    degrade_bound = [(b.at, b.baseline + thresholds.degrade_z * b.spread if b.baseline is not None
                      and b.spread is not None else None) for b in baseline]
    return {
        "z": time_chart(
            [Series("Z-score", list(zip(ats, [p.z for p in points], strict=True)))],
            title=f"Z-score vs peers ({signal})", unit="σ", start=start, end=end, markers=markers,
            thresholds=[Threshold("degrade Z", thresholds.degrade_z, "#b85c00"),
                        Threshold("quarantine Z", thresholds.quarantine_z, "#c62828")],
        ),
        "ema": time_chart(
            [Series("node EMA", list(zip(ats, [p.ema for p in points], strict=True))),
             Series("peer baseline (detector)", [(b.at, b.baseline) for b in baseline], PALETTE[2], dashed=True),
             Series(f"degrade bound (baseline + {thresholds.degrade_z:g}σ)", degrade_bound, PALETTE[1], dashed=True)],
            title=f"{ema_title}: EMA vs peer baseline", unit=unit, start=start, end=end, markers=markers,
        ),
        "weight": time_chart(
            [Series("weight", list(zip(ats, [p.weight for p in points], strict=True)), PALETTE[3])],
            title="Published weight", unit="weight", start=start, end=end, markers=markers, height=160,
        ),
        "tail": time_chart(
            [Series("P99", list(zip(tail_ats, [p.p99 for p in tail_points], strict=True)), PALETTE[1]),
             Series("P50", list(zip(tail_ats, [p.p50 for p in tail_points], strict=True)))],
            title="P99 and P50 of the tail window (x the peers' baseline)", unit=ratio_unit, start=start, end=end, markers=markers,
        ),
        "evidence": time_chart(
            [Series("evidence", [(p.at, p.evidence) for p in evidence_points], PALETTE[1])],
            title=f"Evidence of being over {thresholds.degrade_materiality:g}x the baseline (CUSUM)", unit="σ",
            start=start, end=end, markers=markers, height=160,
            thresholds=[Threshold("weight cut", thresholds.degrade_evidence, "#b85c00")],
        ),
    }
