"""The signals of a group and each node's EW statistics of them.

Four signals (see :mod:`detector.samples` and :mod:`detector.engine_metrics` for where they come from):

- ``norm``: total latency over the group's learned cost model ``a*prompt + b*completion + c``
  (:mod:`detector.costmodel`, a robust fit on healthy nodes' recent requests; ``normalization="seed"``
  keeps seed 000's fixed ``T_total / (prompt*w + completion)``). A **latency-only** record (a log
  format without token counts) is judged as ``total / typical``, ``typical`` the median latency of the
  healthy requests the fit is trained on, clipped to ``[1/2, 2]`` (:data:`LATENCY_ONLY_CLIP`: a long
  request and a slow one look alike without tokens, so no one request may count for much), and it
  enters the EMA with the weight ``(sd_ref / sd_latency)^2`` (inverse-variance weighting: request
  sizes make it several times noisier than a token-normalised sample, so it takes that many more to
  move the EMA as far). Without tokens only the peer comparison over enough samples evens out request
  sizes: detection is slower, which the README states;
- ``prefill``: TTFT over its own fit on the prompt length. It includes the wait for a batch slot;
- ``decode``: milliseconds per output token after the first, ``(total - ttft) / (completion - 1)``,
  or ``token_ms / tokens`` of a streamed progress row: queue-free, since the wait for a batch slot ends
  before the first token;
- ``prefill_time``: the **queue-free** prefill time over its fit on the prompt tokens actually
  computed, ``prefill_ms ≈ a * computed_tokens + c``: per progress row, from the model server's own
  prefill histogram (``prefill_ms / prefills`` against the mean computed tokens per prefill: for a
  linear model the mean of the predictions is the prediction at the mean), and per request where the
  log carries the queue time (``ttft - queue``). Prefix-cache hits are taken out of the prompt
  (``computed = prompt - cached``) here and in the ``norm`` and ``prefill`` fits, so a node that
  serves more cache hits does not look fast and its peers slow.

``decode`` and ``prefill_time`` are the **queue-free** signals (:data:`QUEUE_FREE`): what decides a
node's state (:mod:`detector.detectors.zscore`).

**Decode at equal load.** On a continuous-batching engine every stream of a node shares one step
time, which grows with the batch, with the context every step reads from the KV cache, and, under
chunked prefill, with the prompt tokens each step also processes:
``decode_ms ≈ c0 + c1 * B + c2 * W + c3 * B*W + c4 * K``, ``W`` the prompt tokens processed per decode
token in the interval (``prefill_work / tokens``), ``K`` the KV-cache usage (``kv_usage``). The
prompt tokens a step carries are ``W`` per decode token times the ``B`` decode tokens of the step:
``B*W`` is the term a step's linear layers pay for (a chunk of ``P`` prompt tokens costs ~0.035 ms
each at tp=8, whatever the batch), so it enters as a product, not as ``W`` alone. Fitted on the
simulator's healthy rows, ``B*W`` took the robust spread of decode over the curve from 1.09 (log) to
0.07 under long-context traffic (8 k-token prompts; without it healthy nodes sat up to 1.8x over the
curve and were quarantined) and from 0.080 to 0.039 in the seed drill. A busier healthy node, or one
that just took a few long prompts, looks slower: in the simulator's vLLM engine a 200 ms row's
ms/token has a robust sd of 0.38 (log) across healthy nodes, 0.13 once divided by this curve. Where rows report the running batch
(and the prefill work), the group's curve is fitted across healthy nodes (the same robust fit, on rows
of healthy nodes only: across nodes, load varies while health does not) and each decode sample is
compared at the group's median load::

    decode_eq = decode_ms * curve(B_ref, W_ref, K_ref) / curve(clip(B), clip(W), clip(K))

The correction divides out the load, not a fault: a node whose every step is ``k`` times slower
decodes at ``k * curve(load)`` whatever its load (and its batch grows, as its requests stay longer:
Little's law), so it reads ``k * curve(ref)``, as slow as it is. The curve is fitted on
healthy rows only and extrapolated at most to twice the largest healthy batch and work
(:data:`BATCH_EXTRAPOLATION`): in a surge every node's batch grows together and the reservoir follows
within a minute. Below the healthy range (P1 of each feature) it is not extrapolated at all: a node
cut to the floor weight runs a batch smaller than any healthy node's, and a fitted line with a
negative intercept then predicted a near-zero step time there, so the cut node's decode read
many times slower than its peers' and it was quarantined for the cut itself. A completed request is corrected with its node's last reported batch at the median
work. ``Thresholds.decode_batch_curve`` switches it off.

:class:`SignalModel` owns the fits, the reservoirs of healthy samples they are fitted on, and one
:class:`~detector.ewma.EwmaArrays` per signal. Every sample enters a node's EMA clipped to
``[baseline / ema_clip, baseline * ema_clip]`` of the group's last peer baseline (ingest data is
untrusted: one record, however extreme, moves an EMA by at most ``alpha * (ema_clip - 1)``
baselines); before a baseline exists only ingest's own bounds apply.
"""

from __future__ import annotations

import math

import numpy as np

from detector.baseline import robust_sd
from detector.costmodel import CostModel, Reservoir, fit_cost_model
from detector.ewma import EwmaArrays
from detector.samples import (
    ProgressBatch,
    SampleBatch,
    decode_per_token,
    prefill_per_token,
    prefill_time_ms,
    seed_norm,
)
from detector.thresholds import BATCH_EXTRAPOLATION, LATENCY_ONLY_CLIP, REFERENCE_SD, Thresholds

SIGNALS: tuple[str, ...] = ("norm", "prefill", "decode", "prefill_time")
#: Each signal in a few words, for a cause read at 3 a.m. (the unit follows from :func:`unit_of`).
SIGNAL_NAMES: dict[str, str] = {"norm": "total latency", "prefill": "time to first token",
                                "decode": "decode time per token", "prefill_time": "prefill time"}


def unit_of(signal: str, normalization: str = "learned") -> str:
    """The unit of a signal's EMA and baseline: decode is ms per output token; "learned"
    normalisation divides latency by the group's cost model (a ratio, 1.0 = as expected), "seed" by
    weighted tokens (ms per token)."""
    if signal == "decode" or normalization == "seed":
        return "ms/token"
    return "x expected"


#: The signals measured after the wait for a batch slot: they decide (detectors.zscore).
QUEUE_FREE: tuple[str, ...] = ("decode", "prefill_time")
_FITS = ("norm", "prefill", "prefill_time", "batch")
#: The load a progress row reports (the engine reservoir's columns): running batch, prompt tokens
#: processed per decode token, and KV-cache usage (the context every decode step reads).
LOAD_FEATURES: tuple[str, ...] = ("b", "w", "k")
#: The decode curve's features: those, and ``p = b * w``, the prompt tokens each decode step carries.
CURVE_FEATURES: tuple[str, ...] = ("b", "w", "p", "k")
#: Healthy rows with a batch needed before the decode curve is fitted (at most four coefficients: a few
#: dozen rows fix them; the robust fit ignores the odd stall).
BATCH_CURVE_MIN_ROWS = 60


class SignalModel:
    """Cost-model fits, their training reservoirs and the per-node EW statistics of every signal."""

    def __init__(self, thresholds: Thresholds, n: int = 0) -> None:
        self.thresholds = thresholds
        self.ewma = {s: EwmaArrays(n, thresholds.ema_alpha) for s in SIGNALS}
        self.fit_norm: CostModel | None = None
        self.fit_prefill: CostModel | None = None
        self.fit_prefill_time: CostModel | None = None
        self.fit_batch: CostModel | None = None
        # The load features of fit_batch, in order, and each one's [median, extrapolation limit].
        self.load_features: tuple[str, ...] = ()
        self.load_ref: dict[str, list[float]] = {}
        self.batch_flat = False  # every healthy node at one load: no curve needed
        self.typical_ms = math.nan
        self.latency_weight = 1.0
        self.reservoir = Reservoir(("p", "c", "t", "f"), thresholds.cost_model_reservoir)
        # The engine's view: x computed tokens per prefill, y prefill ms; the load features (b running
        # batch, w prompt tokens processed per decode token, k KV-cache usage) and d decode ms.
        self.engine = Reservoir(("x", "y", *LOAD_FEATURES, "d"), thresholds.cost_model_reservoir)
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
            self.engine = self.engine.resized(thresholds.cost_model_reservoir)

    # ---------------------------------------------------------------------------------- signals
    def per_request(self, b: SampleBatch, running: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per-request signals; NaN where a fit is missing (learned mode) or an input is unknown.
        ``running``: each request's node's last reported batch (for decode at equal batch)."""
        t = self.thresholds
        decode = decode_per_token(b)
        if t.normalization == "seed":
            nan = np.full(len(b), np.nan)
            return {"norm": seed_norm(b, t.seed_prompt_weight), "prefill": prefill_per_token(b),
                    "decode": decode, "prefill_time": nan}
        prompt = b.computed_prompt()
        norm = np.full(len(b), np.nan)
        if self.fit_norm is not None:
            pred = self.fit_norm.predict(np.column_stack([prompt, b.completion_tokens]))
            with np.errstate(invalid="ignore"):
                norm = b.total_ms / np.maximum(pred, 1e-6)
        if math.isfinite(self.typical_ms):
            lat = np.clip(b.total_ms / self.typical_ms, 1.0 / LATENCY_ONLY_CLIP, LATENCY_ONLY_CLIP)
            norm = np.where(b.latency_only(), lat, norm)
        return {
            "norm": norm,
            "prefill": self._over_fit(self.fit_prefill, b.ttft_ms, prompt),
            "decode": decode * self.batch_factor(running) if running is not None else decode,
            "prefill_time": self._over_fit(self.fit_prefill_time, prefill_time_ms(b), prompt),
        }

    def per_row(self, b: ProgressBatch, recomputing: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per progress row: ``decode`` (at equal load) and ``prefill_time`` (NaN without prefills).

        A row ``recomputing`` (its node preempted requests just before: their evicted KV cache is
        computed again) is credited at most the healthy rows' median prompt work per decode token:
        the prompts it computes again are work its own shortage of KV memory made, and its streams
        are as slow for its users as the curve then says."""
        with np.errstate(divide="ignore", invalid="ignore"):
            per_prefill_ms = np.where(b.prefills > 0, b.prefill_ms / b.prefills, np.nan)
            per_prefill_tokens = b.prefill_tokens / b.prefills
            work = b.work_per_token()
            if recomputing is not None and "w" in self.load_ref:
                work = np.where(recomputing, np.fmin(work, self.load_ref["w"][0]), work)
        return {
            "decode": b.decode_ms() * self.batch_factor(b.running, work, b.kv_usage),
            "prefill_time": self._over_fit(self.fit_prefill_time, per_prefill_ms, per_prefill_tokens),
        }

    @staticmethod
    def _over_fit(fit: CostModel | None, y: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        if fit is None:
            return np.full(len(y), np.nan)
        pred = fit.predict(np.where(np.isfinite(tokens), tokens, 0.0)[:, None])
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(tokens), y / np.maximum(pred, 1e-6), np.nan)

    def beyond_work(self, b: ProgressBatch) -> np.ndarray:
        """Per row: its prompt work per decode token is past the decode curve's extrapolation limit
        (:data:`~detector.thresholds.BATCH_EXTRAPOLATION` times the healthy P99): the row measures a
        prefill the curve cannot take out, more than the decode step (False without a curve)."""
        if (self.fit_batch is None or self.batch_flat or not self.thresholds.decode_batch_curve
                or "w" not in self.load_features):
            return np.zeros(len(b), dtype=bool)
        work = b.work_per_token()
        with np.errstate(invalid="ignore"):
            return np.isfinite(work) & (work > self.load_ref["w"][1])

    def batch_factor(self, running: np.ndarray, work: np.ndarray | None = None,
                     kv_usage: np.ndarray | None = None) -> np.ndarray:
        """``curve(ref) / curve(clip(load))`` per sample (an unknown feature: its median); 1 where no
        curve is needed (switched off, no batch reported, or every healthy node at one load); NaN
        (not judged yet) for a reported batch while the group's curve is still being learned: a busy
        healthy node must not be cut in the seconds before the curve exists."""
        fit = self.fit_batch
        if not self.thresholds.decode_batch_curve or self.batch_flat:
            return np.ones(len(running))
        if fit is None:
            return np.where(np.isfinite(running), np.nan, 1.0)
        given = {"b": running, "w": work, "k": kv_usage,
                 "p": None if work is None else running * work}
        cols, ref = [], []
        for f in self.load_features:
            median, limit, *low = self.load_ref[f]
            v = given[f]
            v = np.full(len(running), median) if v is None else np.where(np.isfinite(v), v, median)
            # Below the healthy range the curve is not extrapolated: it was never measured there,
            # and a fitted line with a negative intercept predicts a near-zero step time for the
            # small batch of a node cut to the floor weight, making it look many times slower.
            cols.append(np.clip(v, low[0] if low else (1.0 if f == "b" else 0.0), limit))
            ref.append(median)
        pred = fit.predict(np.column_stack(cols))
        at_ref = fit.predict(np.array([ref]))[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            # A curve that predicts no positive step time at a load has nothing to say there.
            return np.where(pred > 0, at_ref / pred, np.nan)

    def probe_value(self, prompt_tokens: float, completion_tokens: float, ttft_ms: float | None,
                    total_ms: float | None, signal: str = "norm") -> float:
        """A canary probe's ``signal`` (``norm``: its latency over the cost model; ``decode``: its
        time per output token); NaN when unknown."""
        if total_ms is None or not math.isfinite(total_ms):
            return math.nan
        b = SampleBatch.from_columns(
            node=["probe"], ts=[0.0], prompt_tokens=[prompt_tokens], completion_tokens=[completion_tokens],
            total_ms=[total_ms], ttft_ms=[np.nan if ttft_ms is None else ttft_ms], status=[200],
        )
        return float(self.per_request(b)[signal][0])

    def sample_weights(self, s: str, b: SampleBatch) -> np.ndarray | None:
        """Per-request EMA weights of signal ``s``: ``latency_weight`` for latency-only records of
        ``norm``, 1 otherwise (``None``: all 1)."""
        if s != "norm" or self.latency_weight >= 1.0:
            return None
        only = b.latency_only()
        return np.where(only, self.latency_weight, 1.0) if only.any() else None

    def update(self, s: str, node: np.ndarray, x: np.ndarray, baseline: float,
               weight: np.ndarray | None = None) -> None:
        """Apply samples of signal ``s`` (grouped by node, time order within), clipped around
        ``baseline`` (NaN: not clipped; see the module docstring), weighted by ``weight``."""
        ok = np.isfinite(x)
        clip = None
        if math.isfinite(baseline) and baseline > 0:
            c = self.thresholds.ema_clip
            clip = (baseline / c, baseline * c)
        self.ewma[s].update(node[ok], x[ok], clip, None if weight is None else weight[ok])

    # ---------------------------------------------------------------------------------- fits
    def add_healthy(self, b: SampleBatch) -> None:
        """Keep healthy nodes' requests for the fits; fit them once there are enough."""
        prompt = b.computed_prompt()
        self.reservoir.add(p=prompt, c=b.completion_tokens, t=b.total_ms, f=b.ttft_ms)
        queue_free = prefill_time_ms(b)
        known = np.isfinite(queue_free)
        if known.any():
            nan = np.full(int(known.sum()), np.nan)
            self.engine.add(x=prompt[known], y=queue_free[known], b=nan, w=nan, k=nan, d=nan)
        if self.fit_norm is None and self.reservoir.filled >= self.thresholds.cost_model_min_samples:
            self.refit()

    def add_healthy_rows(self, b: ProgressBatch) -> None:
        """Keep healthy nodes' progress rows for the prefill-time fit and the decode batch curve."""
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(b.prefills > 0, b.prefill_tokens / b.prefills, np.nan)
            y = np.where(b.prefills > 0, b.prefill_ms / b.prefills, np.nan)
            d = np.where(b.tokens > 0, b.decode_ms(), np.nan)
        keep = np.isfinite(y) | (np.isfinite(b.running) & np.isfinite(d))
        w = b.work_per_token()
        self.engine.add(x=x[keep], y=y[keep], b=b.running[keep], w=w[keep], k=b.kv_usage[keep], d=d[keep])
        # The first fits as soon as there is enough (later: on the refit cadence), and only for a fit
        # this batch brings data to: a group whose servers report no prefill histogram would refit
        # the batch curve on every row otherwise.
        first_prefill = self.fit_prefill_time is None and bool(np.isfinite(y).any())
        first_batch = self.fit_batch is None and not self.batch_flat and bool((keep & np.isfinite(b.running)).any())
        if first_prefill or first_batch:
            self._refit_engine()

    def refit(self, now: float | None = None) -> None:
        """Refit the models on the reservoirs (with ``now``: at most every ``cost_model_refit_s``)."""
        t = self.thresholds
        if now is not None:
            if now - self.fit_at < t.cost_model_refit_s:
                return
            self.fit_at = now
        if self.reservoir.filled >= t.cost_model_min_samples:
            r = self.reservoir.rows()
            p, c, total, f = r["p"], r["c"], r["t"], r["f"]
            self.typical_ms = float(np.median(total))
            tokens = np.isfinite(p) & np.isfinite(c)
            if tokens.sum() >= t.cost_model_min_samples:
                self.fit_norm = fit_cost_model(np.column_stack([p, c])[tokens], total[tokens],
                                               start=self.fit_norm) or self.fit_norm
            self._weigh_latency_only(total[~tokens])
            has_ttft = np.isfinite(f) & np.isfinite(p)
            if has_ttft.sum() >= t.cost_model_min_samples:
                self.fit_prefill = fit_cost_model(p[has_ttft][:, None], f[has_ttft],
                                                  start=self.fit_prefill) or self.fit_prefill
        self._refit_engine()

    def _weigh_latency_only(self, total: np.ndarray) -> None:
        """``latency_weight = clip((sd_ref / sd_latency)^2, 0.01, 1)``: inverse-variance weighting of
        a latency-only sample against a token-normalised one (``sd_ref``: the cost model's residual
        spread, else :data:`REFERENCE_SD`; ``sd_latency``: the robust spread of the clipped
        ``log(total / typical)`` of healthy latency-only requests)."""
        if len(total) < self.thresholds.min_samples * 10:
            return
        r = np.log(np.clip(total / self.typical_ms, 1.0 / LATENCY_ONLY_CLIP, LATENCY_ONLY_CLIP))
        sd = robust_sd(r)
        ref = self.fit_norm.residual_sd if self.fit_norm is not None else REFERENCE_SD
        self.latency_weight = float(np.clip((ref / max(sd, 1e-6)) ** 2, 0.01, 1.0))

    def _refit_engine(self) -> None:
        t = self.thresholds
        e = self.engine.rows()
        x, y, b, d = e["x"], e["y"], e["b"], e["d"]
        has_prefill = np.isfinite(x) & np.isfinite(y)
        if has_prefill.sum() >= t.cost_model_min_samples:
            self.fit_prefill_time = fit_cost_model(x[has_prefill][:, None], y[has_prefill],
                                                   start=self.fit_prefill_time) or self.fit_prefill_time
        has_batch = np.isfinite(b) & np.isfinite(d)
        if has_batch.sum() < BATCH_CURVE_MIN_ROWS:
            return
        # The batch always; prefill work and KV usage where most rows report them.
        features = ["b"] + [f for f in LOAD_FEATURES[1:]
                            if (has_batch & np.isfinite(e[f])).sum() >= max(BATCH_CURVE_MIN_ROWS, has_batch.sum() // 2)]
        rows = has_batch.copy()
        for f in features:
            rows &= np.isfinite(e[f])
        e = {**e, "p": e["b"] * e["w"]}
        if "w" in features:
            features.insert(features.index("w") + 1, "p")
        ref: dict[str, list[float]] = {}
        spread = []
        for f in features:
            p1, p10, median, p90, p99 = np.percentile(e[f][rows], (1, 10, 50, 90, 99))
            ref[f] = [float(median), BATCH_EXTRAPOLATION * float(p99), max(float(p1), 1.0 if f == "b" else 0.0)]
            spread.append(p90 - p10 >= (1.0 if f == "b" else 1e-9))
        # (Nearly) every healthy row at one load: nothing to learn, nothing to correct.
        self.batch_flat = not any(spread)
        if self.batch_flat:
            return
        x_load = np.column_stack([e[f][rows] for f in features])
        same = self.fit_batch is not None and tuple(features) == self.load_features
        fit = fit_cost_model(x_load, d[rows], start=self.fit_batch if same else None)
        if fit is not None:
            self.fit_batch, self.load_features, self.load_ref = fit, tuple(features), ref

    # ---------------------------------------------------------------------------------- snapshot
    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for s, e in self.ewma.items():
            out[f"e.{s}.mean"], out[f"e.{s}.sq"], out[f"e.{s}.count"] = e.mean, e.sq, e.count
        for k, v in self.reservoir.columns.items():
            out[f"r.{k}"] = v
        for k, v in self.engine.columns.items():
            out[f"q.{k}"] = v
        for name, fit in self.fits().items():
            out[f"fit.{name}"] = fit.coef
        return out

    def fits(self) -> dict[str, CostModel]:
        found = ((name, getattr(self, f"fit_{name}")) for name in _FITS)
        return {name: fit for name, fit in found if fit is not None}

    def meta(self) -> dict[str, object]:
        return {"res_pos": self.reservoir.pos, "res_filled": self.reservoir.filled, "fit_at": self.fit_at,
                "engine_pos": self.engine.pos, "engine_filled": self.engine.filled,
                "typical_ms": self.typical_ms, "latency_weight": self.latency_weight,
                "load_features": list(self.load_features), "load_ref": self.load_ref, "batch_flat": self.batch_flat,
                "fits": {name: [fit.residual_sd, fit.n_samples] for name, fit in self.fits().items()}}

    def restore(self, z: dict[str, np.ndarray], meta: dict) -> None:
        """Restore :meth:`arrays` and :meth:`meta`; a snapshot from before a signal, the engine
        reservoir or a fit existed restores with them empty."""
        n = len(z["e.norm.mean"])
        for s, e in self.ewma.items():
            if f"e.{s}.mean" in z:
                e.mean, e.sq, e.count = z[f"e.{s}.mean"].copy(), z[f"e.{s}.sq"].copy(), z[f"e.{s}.count"].copy()
            else:
                e.mean, e.sq, e.count = np.zeros(n), np.zeros(n), np.zeros(n)
        for k in self.reservoir.columns:
            self.reservoir.columns[k] = z[f"r.{k}"].copy()
        self.reservoir.pos, self.reservoir.filled = meta["res_pos"], meta["res_filled"]
        if "q.x" in z:
            for k in self.engine.columns:  # a column an older snapshot lacks: unknown (NaN)
                self.engine.columns[k] = z[f"q.{k}"].copy() if f"q.{k}" in z else np.full(len(z["q.x"]), np.nan)
            self.engine.pos, self.engine.filled = meta["engine_pos"], meta["engine_filled"]
        self.typical_ms = meta.get("typical_ms", math.nan)
        self.latency_weight = meta.get("latency_weight", 1.0)
        self.load_features = tuple(meta.get("load_features", ()))
        self.load_ref = meta.get("load_ref", {})
        self.batch_flat = meta.get("batch_flat", False)
        # Snapshots before this module kept the fit time among the group's "last" values.
        self.fit_at = meta.get("fit_at", meta.get("last", {}).get("fit_at", -math.inf))
        for name, (sd, count) in meta["fits"].items():
            setattr(self, f"fit_{name}", CostModel(coef=z[f"fit.{name}"].copy(), residual_sd=sd, n_samples=count))
        if self.fit_batch is not None and (len(self.fit_batch.coef) != len(self.load_features) + 1
                                           or ("w" in self.load_features) != ("p" in self.load_features)):
            self.fit_batch = None  # a curve of an older layout: learned again from the reservoir
