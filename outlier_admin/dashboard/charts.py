"""The node page's charts, built from the timeline (:mod:`outlier_admin.history.timeline`)."""

from __future__ import annotations

import bisect
from datetime import datetime

from django.utils.safestring import SafeString

from detector.signals import unit_of
from detector.states import NodeState as S
from detector.thresholds import Thresholds
from outlier_admin.control.models import CanaryProbe, Transition
from outlier_admin.dashboard.heatmap import STATE_COLORS
from outlier_admin.dashboard.svg import PALETTE, Band, Series, Threshold, time_chart
from outlier_admin.history.timeline import BaselinePoint, Point

#: Chart width in SVG units: the charts fill the page's width, and text stays ~10 px on a wide screen.
CHART_WIDTH = 1200


def state_bands(points: list[Point], transitions: list[Transition], end: datetime) -> list[Band]:
    """One band per run of a state other than ``healthy``, from the history rows (and the
    transitions, which give the exact moment of each change): a quarantine with twenty probes is one
    shaded span, not twenty overlapping markers."""
    changes = sorted([(p.at, p.state) for p in points] + [(t.at, t.to_state) for t in transitions])
    bands, run_start, run_state = [], None, None
    for at, state in [*changes, (end, None)]:
        if state != run_state:
            if run_state is not None and run_state != S.HEALTHY.label and run_start is not None and at > run_start:
                bands.append(Band(run_start, at, f"{run_state} from {run_start:%H:%M:%S} to {at:%H:%M:%S} UTC",
                                  STATE_COLORS.get(run_state, "#555")))
            run_start, run_state = at, state
    return bands


def probe_z(probes: list[CanaryProbe], norm_baseline: list[BaselinePoint]) -> list[tuple[datetime, float | None]]:
    """Each judged canary probe as a Z against the group's norm baseline at its time:
    ``(normalised latency - baseline) / spread``, the scale on which the detector's own Z is read
    (a quarantined node gets no traffic, so during quarantine its probes are its only Z)."""
    known = [b for b in norm_baseline if b.baseline is not None and b.spread]
    ats = [b.at for b in known]
    out = []
    for p in sorted(probes, key=lambda p: p.at):
        i = bisect.bisect_right(ats, p.at) - 1
        if p.normalised_latency is None or not known:
            continue
        b = known[max(i, 0)]
        out.append((p.at, (p.normalised_latency - b.baseline) / b.spread))
    return out


def signal_unit(signal: str, thresholds: Thresholds) -> str:
    """The unit of a signal's EMA (:func:`detector.signals.unit_of`) under ``thresholds``."""
    return unit_of(signal, thresholds.normalization)


def node_charts(
    points: list[Point], baseline: list[BaselinePoint], transitions: list[Transition],
    thresholds: Thresholds, start: datetime, end: datetime, *, signal: str = "norm",
    tail_points: list[Point] | None = None, evidence_points: list[Point] | None = None,
    probes: list[CanaryProbe] | None = None, norm_baseline: list[BaselinePoint] | None = None,
) -> dict[str, SafeString]:
    """``{"z", "ema", "weight", "tail", "evidence"}`` SVG charts for one node over ``[start, end]``.

    ``tail_points`` (the norm rows, which carry the tail window) and ``evidence_points`` (the rows of
    the signal the detector decides on, which carry the evidence) default to ``points``.

    The EMA chart draws the group's stored detector baseline and the degrade bound
    ``baseline + degrade_z * spread`` (where the node's EMA crosses it, its Z crosses ``degrade_z``).
    Every chart shades the node's states (:func:`state_bands`); the Z chart adds the canary probes as
    Z (:func:`probe_z`; ``norm_baseline`` defaults to ``baseline``)."""
    bands = state_bands(points, transitions, end)
    ats = [p.at for p in points]
    z_series = [Series("Z-score", list(zip(ats, [p.z for p in points], strict=True)))]
    if probes:
        z_series.append(Series("canary probe (Z vs norm baseline)",
                               probe_z(probes, baseline if norm_baseline is None else norm_baseline),
                               PALETTE[3], dots=True))
    ratio_unit = signal_unit("norm", thresholds)
    unit = signal_unit(signal, thresholds)
    ema_title = {"decode": "Decode time per token", "prefill": "Time to first token (normalised)",
                 "prefill_time": "Prefill time without the queue (normalised)"}.get(signal, "Normalised latency")
    tail_points = points if tail_points is None else tail_points
    tail_ats = [p.at for p in tail_points]
    evidence_points = points if evidence_points is None else evidence_points
    degrade_bound = [(b.at, b.baseline + thresholds.degrade_z * b.spread if b.baseline is not None
                      and b.spread is not None else None) for b in baseline]
    return {
        "z": time_chart(
            z_series,
            title=f"Z-score vs peers ({signal})", unit="σ", start=start, end=end, bands=bands, width=CHART_WIDTH,
            thresholds=[Threshold("degrade Z", thresholds.degrade_z, "#b85c00"),
                        Threshold("quarantine Z", thresholds.quarantine_z, "#c62828")],
        ),
        "ema": time_chart(
            [Series("node EMA", list(zip(ats, [p.ema for p in points], strict=True))),
             Series("peer baseline (detector)", [(b.at, b.baseline) for b in baseline], PALETTE[2], dashed=True),
             Series(f"degrade bound (baseline + {thresholds.degrade_z:g}σ)", degrade_bound, PALETTE[1], dashed=True)],
            title=f"{ema_title}: EMA vs peer baseline", unit=unit, start=start, end=end, bands=bands, width=CHART_WIDTH,
        ),
        "weight": time_chart(
            [Series("weight", list(zip(ats, [p.weight for p in points], strict=True)), PALETTE[3])],
            title="Published weight", unit="weight", start=start, end=end, bands=bands, width=CHART_WIDTH, height=160,
        ),
        "tail": time_chart(
            [Series("P99", list(zip(tail_ats, [p.p99 for p in tail_points], strict=True)), PALETTE[1]),
             Series("P50", list(zip(tail_ats, [p.p50 for p in tail_points], strict=True)))],
            title="P99 and P50 of the node's recent requests (tail window)", unit=ratio_unit, start=start, end=end, bands=bands, width=CHART_WIDTH,
        ),
        "evidence": time_chart(
            [Series("evidence", [(p.at, p.evidence) for p in evidence_points], PALETTE[1])],
            title=f"Evidence of being over {thresholds.degrade_materiality:g}x the baseline (CUSUM)", unit="σ",
            start=start, end=end, bands=bands, width=CHART_WIDTH, height=160,
            thresholds=[Threshold("weight cut", thresholds.degrade_evidence, "#b85c00")],
        ),
    }
