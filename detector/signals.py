"""The per-request signals of a group and each node's EW statistics of them.

Three signals per request (see :mod:`detector.samples` for the formulas):

- ``norm``: total latency over the group's learned cost model ``a*prompt + b*completion + c``
  (:mod:`detector.costmodel`, a robust fit on healthy nodes' recent requests; ``normalization="seed"``
  keeps seed 000's fixed ``T_total / (prompt*w + completion)``);
- ``prefill``: TTFT over its own fit on the prompt length;
- ``decode``: milliseconds per output token after the first, ``(total - ttft) / (completion - 1)``:
  queue-free, since the wait for a batch slot ends before the first token.

:class:`SignalModel` owns the cost-model fits, the reservoir of healthy samples they are fitted on, and
one :class:`~detector.ewma.EwmaArrays` per signal. Every sample enters a node's EMA clipped to
``[baseline / ema_clip, baseline * ema_clip]`` of the group's last peer baseline (ingest data is
untrusted: one record, however extreme, moves an EMA by at most ``alpha * (ema_clip - 1)``
baselines); before a baseline exists only ingest's own bounds apply.
"""

from __future__ import annotations

import math

import numpy as np

from detector.costmodel import CostModel, Reservoir, fit_cost_model
from detector.ewma import EwmaArrays
from detector.samples import SampleBatch, decode_per_token, prefill_per_token, seed_norm
from detector.thresholds import Thresholds

SIGNALS: tuple[str, ...] = ("norm", "prefill", "decode")


class SignalModel:
    """Cost-model fits, their training reservoir and the per-node EW statistics of every signal."""

    def __init__(self, thresholds: Thresholds, n: int = 0) -> None:
        self.thresholds = thresholds
        self.ewma = {s: EwmaArrays(n, thresholds.ema_alpha) for s in SIGNALS}
        self.fit_norm: CostModel | None = None
        self.fit_prefill: CostModel | None = None
        self.reservoir = Reservoir(("p", "c", "t", "f"), thresholds.cost_model_reservoir)
        self.fit_at = -math.inf

    # ------------------------------------------------------------------------------- membership
    def append(self) -> None:
        for e in self.ewma.values():
            e.append(1)

    def delete(self, i: int) -> None:
        for e in self.ewma.values():
            e.delete(i)

    def forget(self, mask: np.ndarray) -> None:
        """Forget the statistics of the nodes in ``mask`` (a fresh start after a quarantine)."""
        for e in self.ewma.values():
            e.reset(mask)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        old, self.thresholds = self.thresholds, thresholds
        for e in self.ewma.values():
            e.alpha = thresholds.ema_alpha
        if thresholds.cost_model_reservoir != old.cost_model_reservoir:
            self.reservoir = self.reservoir.resized(thresholds.cost_model_reservoir)

    # ---------------------------------------------------------------------------------- signals
    def per_request(self, b: SampleBatch) -> dict[str, np.ndarray]:
        """Per-request signals. ``norm`` is NaN until the cost model is fitted (learned mode)."""
        t = self.thresholds
        if t.normalization == "seed":
            return {"norm": seed_norm(b, t.seed_prompt_weight), "prefill": prefill_per_token(b),
                    "decode": decode_per_token(b)}
        norm = np.full(len(b), np.nan)
        if self.fit_norm is not None:
            pred = self.fit_norm.predict(np.column_stack([b.prompt_tokens, b.completion_tokens]))
            norm = b.total_ms / np.maximum(pred, 1e-6)
        prefill = np.full(len(b), np.nan)
        if self.fit_prefill is not None:
            pred = self.fit_prefill.predict(b.prompt_tokens[:, None])
            prefill = b.ttft_ms / np.maximum(pred, 1e-6)
        return {"norm": norm, "prefill": prefill, "decode": decode_per_token(b)}

    def probe_value(self, prompt_tokens: float, completion_tokens: float, ttft_ms: float | None,
                    total_ms: float | None) -> float:
        """A canary probe's latency on the scale it is judged on (``norm``); NaN when unknown."""
        if total_ms is None or not math.isfinite(total_ms):
            return math.nan
        b = SampleBatch.from_columns(
            node=["probe"], ts=[0.0], prompt_tokens=[prompt_tokens], completion_tokens=[completion_tokens],
            total_ms=[total_ms], ttft_ms=[np.nan if ttft_ms is None else ttft_ms], status=[200],
        )
        return float(self.per_request(b)["norm"][0])

    def update(self, s: str, node: np.ndarray, x: np.ndarray, baseline: float) -> None:
        """Apply samples of signal ``s`` (grouped by node, time order within), clipped around
        ``baseline`` (NaN: not clipped; see the module docstring)."""
        ok = np.isfinite(x)
        clip = None
        if math.isfinite(baseline) and baseline > 0:
            c = self.thresholds.ema_clip
            clip = (baseline / c, baseline * c)
        self.ewma[s].update(node[ok], x[ok], clip)

    # ---------------------------------------------------------------------------------- cost model
    def add_healthy(self, b: SampleBatch) -> None:
        """Keep healthy nodes' requests for the cost-model fit; fit it once there are enough."""
        self.reservoir.add(p=b.prompt_tokens, c=b.completion_tokens, t=b.total_ms, f=b.ttft_ms)
        if self.fit_norm is None and self.reservoir.filled >= self.thresholds.cost_model_min_samples:
            self.refit()

    def refit(self, now: float | None = None) -> None:
        """Refit both cost models on the reservoir (with ``now``: at most every ``cost_model_refit_s``)."""
        if self.reservoir.filled < self.thresholds.cost_model_min_samples:
            return
        if now is not None:
            if now - self.fit_at < self.thresholds.cost_model_refit_s:
                return
            self.fit_at = now
        r = self.reservoir.rows()
        p, c, t, f = r["p"], r["c"], r["t"], r["f"]
        fit = fit_cost_model(np.column_stack([p, c]), t, start=self.fit_norm)
        if fit is not None:
            self.fit_norm = fit
        has_ttft = np.isfinite(f)
        if has_ttft.sum() >= self.thresholds.cost_model_min_samples:
            fit_p = fit_cost_model(p[has_ttft][:, None], f[has_ttft], start=self.fit_prefill)
            if fit_p is not None:
                self.fit_prefill = fit_p

    # ---------------------------------------------------------------------------------- snapshot
    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for s, e in self.ewma.items():
            out[f"e.{s}.mean"], out[f"e.{s}.sq"], out[f"e.{s}.count"] = e.mean, e.sq, e.count
        for k, v in self.reservoir.columns.items():
            out[f"r.{k}"] = v
        for name, fit in self.fits().items():
            out[f"fit.{name}"] = fit.coef
        return out

    def fits(self) -> dict[str, CostModel]:
        return {name: fit for name, fit in (("norm", self.fit_norm), ("prefill", self.fit_prefill)) if fit is not None}

    def meta(self) -> dict[str, object]:
        return {"res_pos": self.reservoir.pos, "res_filled": self.reservoir.filled, "fit_at": self.fit_at,
                "fits": {name: [fit.residual_sd, fit.n_samples] for name, fit in self.fits().items()}}

    def restore(self, z: dict[str, np.ndarray], meta: dict) -> None:
        for s, e in self.ewma.items():
            e.mean, e.sq, e.count = z[f"e.{s}.mean"].copy(), z[f"e.{s}.sq"].copy(), z[f"e.{s}.count"].copy()
        for k in self.reservoir.columns:
            self.reservoir.columns[k] = z[f"r.{k}"].copy()
        self.reservoir.pos, self.reservoir.filled = meta["res_pos"], meta["res_filled"]
        # Snapshots before this module kept the fit time among the group's "last" values.
        self.fit_at = meta.get("fit_at", meta.get("last", {}).get("fit_at", -math.inf))
        for name, (sd, count) in meta["fits"].items():
            setattr(self, f"fit_{name}", CostModel(coef=z[f"fit.{name}"].copy(), residual_sd=sd, n_samples=count))
