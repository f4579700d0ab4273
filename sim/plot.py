"""One PNG per scenario: cluster P99 over time per policy, and the faulty nodes' score and weight."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_report(report: dict[str, Any], sims: dict[str, Any], out: str | Path,
                degrade_z: float = 2.0, quarantine_z: float = 3.5) -> Path:
    """Top: cluster P99 (5 s bins) per policy and the fault-free baseline, fault windows shaded.
    Bottom: for ``default`` and ``seed_zscore``, each tracked node's Z (left axis, with the degrade and
    quarantine thresholds) and weight fraction (right axis)."""
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    base = report["baseline"]["timeline"]
    ax1.plot(base["t"], [math.nan if v is None else v / 1000 for v in base["p99_ms"]], "k--", lw=1,
             label="baseline (no fault, round_robin)")
    for name, r in report["policies"].items():
        tl = r["timeline"]
        ax1.plot(tl["t"], [math.nan if v is None else v / 1000 for v in tl["p99_ms"]], lw=1.3, label=name)
    scn_faults = next(iter(report["policies"].values()))["faults"] if report["policies"] else []
    for f in scn_faults:
        end = report.get("duration_s", 0)
        ax1.axvline(f["onset_s"], color="red", lw=0.8, alpha=0.6)
        ax2.axvline(f["onset_s"], color="red", lw=0.8, alpha=0.6)
        ax1.text(f["onset_s"], 0.98, f" {f['kind']} n{f['node']}", transform=ax1.get_xaxis_transform(),
                 fontsize=7, va="top", color="red")
        del end
    ax1.set_ylabel("cluster P99 (s)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7, ncol=3)
    ax1.set_title(f"{report['scenario']}: client P99 per 5 s")
    axw = ax2.twinx()
    styles = {"default": "-", "seed_zscore": ":"}
    plotted = False
    for pname, ls in styles.items():
        sim = sims.get(pname)
        if sim is None:
            continue
        for (gi, node), pts in sorted(sim.log.series.items()):
            if not pts:
                continue
            t = [p[0] for p in pts]
            ax2.plot(t, [p[1] for p in pts], ls, lw=1, label=f"{pname} Z g{gi}/n{node}")
            axw.plot(t, [p[2] for p in pts], ls, lw=1, alpha=0.5, color="grey")
            plotted = True
    ax2.axhline(degrade_z, color="orange", lw=0.8, ls="--", label=f"degrade Z={degrade_z}")
    ax2.axhline(quarantine_z, color="red", lw=0.8, ls="--", label=f"quarantine Z={quarantine_z}")
    ax2.set_ylabel("Z of faulty node")
    axw.set_ylabel("weight / base (grey)")
    axw.set_ylim(-0.05, 1.3)
    ax2.set_xlabel("simulated time (s)")
    if plotted:
        ax2.set_ylim(-3, 30)
    ax2.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
