"""Step time of one engine iteration, from measured profiles (``data/profiles/``, ``data/traces/``).

One vLLM step runs ``T = P + D`` tokens through the model: ``P`` prefill tokens (chunks of prompts)
and one token for each of ``D`` decoding sequences whose KV caches hold ``C`` tokens in all. Its time
is the sum of four parts, each bound by one resource of the node::

    step_ms = L * lin_tp(T) * roof(T)          linear layers   (Vidur, measured per tp and T)
            + kv_ms(C)  + seq_ms * D           decode attention (HBM: KV bytes; Splitwise per sequence)
            + attn_pf_ms(sum chunk*(prefix + chunk/2))   prefill attention (tensor-core FLOPs)
            + 2 * L * allreduce_tp(T * hidden * 2 B)      tensor-parallel collectives (Vidur, DGX)
            + fixed_ms                                    scheduler, sampling, launch (Splitwise)

``lin_tp(T)`` is Vidur's measured per-layer time of the token-parallel operators (QKV/O projections,
MLP, norms) for llama2-70b; below ~200 tokens it is flat (the weights are read from HBM once per
step: memory-bound), above it grows linearly (compute-bound). Under a fault the measured time is
scaled by the roofline ratio ``max(m0 * hbm, m0 * k * sm, s*T * sm) / max(m0, s*T)`` (``m0`` the flat
floor, ``s`` the slope at large T, times as multipliers), so a slower SM clock slows prefill and big
batches fully and a small decode batch only once the clock is too low to keep HBM busy (``k = 0.5``:
an assumption, not a measurement: the load instructions of a memory-bound kernel need about half the
full clock to saturate HBM, so a 2.86x clock drop makes a small decode step ~1.4x slower); a slower
HBM does the reverse. ``kv_ms`` reads ``C * 2 * L * kv_heads *
head_dim * 2 B / tp`` bytes at 70 % of the HBM bandwidth; prefill attention does ``4 * hidden`` FLOPs
per (token, context token) at 60 % of the dense fp16 peak. ``fixed_ms`` and the per-sequence
``seq_ms`` (measured at tp=2, scaled by ``2/tp``) are least-squares fits to Splitwise's measured
llama2-70b/h100 iteration times (``token_time`` at batch 1..64, context 512+64): Splitwise reports
tensor_parallel 2, and Vidur's tp=2 tables reproduce its prefill times within ~10 % with no fit at all
(see ``tests/sim/test_sim_step_engine.py``).
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.traces import traces_dir

# llama2-70b (llama3-70b has the same shapes but a larger vocabulary, which only the embedding sees).
LAYERS = 80
HIDDEN = 8192
KV_HEADS = 8
HEAD_DIM = 128
WEIGHT_BYTES = 69e9 * 2  # fp16
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, every layer, fp16: 320 KiB

HARDWARE = {
    # dense fp16 tensor-core peak (TFLOP/s), HBM bandwidth (GB/s), memory (GiB), host link (GB/s, PCIe)
    "h100": {"tflops": 989.0, "hbm_gbps": 3350.0, "mem_gib": 80.0, "host_gbps": 55.0},
    "a100": {"tflops": 312.0, "hbm_gbps": 2039.0, "mem_gib": 80.0, "host_gbps": 25.0},
}
TP_DEGREES = (1, 2, 4, 8)
HBM_EFFICIENCY = 0.7
FLOPS_EFFICIENCY = 0.6
MEM_ISSUE_CLOCK = 0.5  # see the module docstring: k
SPLITWISE_TP = 2
SPLITWISE_CONTEXT = 512 + 64  # prompt 512, half of the 128 generated tokens


def profiles_dir() -> Path:
    return traces_dir().parent / "profiles"


@functools.lru_cache(maxsize=8)
def linear_table(hardware: str, tp: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(num_tokens, layer_ms, emb_ms)`` of Vidur's llama2-70b token-parallel operators."""
    xs, ys, emb = [], [], []
    with (profiles_dir() / f"vidur_llama2_70b_{hardware}_linear.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["tp"]) == tp:
                xs.append(int(row["num_tokens"]))
                ys.append(float(row["layer_ms"]))
                emb.append(float(row["emb_ms"]))
    if not xs:
        raise KeyError(f"no Vidur linear profile for {hardware} tp={tp}")
    order = np.argsort(xs)
    return np.asarray(xs, dtype=np.float64)[order], np.asarray(ys)[order], float(np.median(emb))


@functools.lru_cache(maxsize=8)
def allreduce_table(hardware: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """``(size_bytes, ms)``: Vidur's NCCL all-reduce on one DGX, the median of each power-of-two bin
    of sizes (single measurements of tiny messages jitter by 2x)."""
    sizes, ms = [], []
    with (profiles_dir() / f"vidur_{hardware}_dgx_all_reduce.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_workers"]) == tp:
                sizes.append(float(row["size_bytes"]))
                ms.append(float(row["median_ms"]))
    if not sizes:
        raise KeyError(f"no Vidur all-reduce profile for {hardware} with {tp} GPUs")
    s, m = np.asarray(sizes), np.asarray(ms)
    bins = np.floor(np.log2(s)).astype(int)
    xs = [float(np.exp2(b + 0.5)) for b in np.unique(bins)]
    ys = [float(np.median(m[bins == b])) for b in np.unique(bins)]
    return np.asarray(xs), np.maximum.accumulate(np.asarray(ys))  # a bigger message is never faster


@functools.lru_cache(maxsize=1)
def splitwise_points(hardware: str = "h100-80gb") -> list[tuple[int, int, float, float]]:
    """``(prompt_size, batch_size, prompt_ms, token_ms)``: medians of Splitwise's llama2-70b rows."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    with (traces_dir() / "splitwise_sim_perf_model.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["model"] == "llama2-70b" and row["hardware"] == hardware:
                by.setdefault((int(row["prompt_size"]), int(row["batch_size"])), []).append(
                    (float(row["prompt_time"]), float(row["token_time"])))
    return [(p, b, float(np.median([x[0] for x in v])), float(np.median([x[1] for x in v])))
            for (p, b), v in sorted(by.items())]


@dataclass(frozen=True)
class Resources:
    """Time multipliers of a node's resources (1 = healthy; 2 = that resource is half as fast)."""

    sm: float = 1.0  # SM clock: compute-bound work (prefill, big batches)
    hbm: float = 1.0  # HBM bandwidth: weight and KV reads (decode)
    net: float = 1.0  # interconnect: the tensor-parallel collectives of each step
    host: float = 1.0  # host link (PCIe): swap, offload, reloads
    prefill: float = 1.0  # the prefill path only (a kernel fallback): prompt tokens' compute


HEALTHY = Resources()


class StepModel:
    """Step time of one node class (hardware, tensor-parallel degree); see the module docstring.

    Tables are precomputed per token count ``T`` so :meth:`step_ms` is a few list reads.
    """

    def __init__(self, hardware: str = "h100", tp: int = 8, max_tokens: int = 8192 + 1024) -> None:
        if hardware not in HARDWARE:
            raise KeyError(f"unknown hardware {hardware!r}")
        self.hardware, self.tp = hardware, tp
        hw = HARDWARE[hardware]
        xs, ys, emb = linear_table(hardware, tp)
        t = np.arange(max_tokens + 1, dtype=np.float64)
        slope = (ys[-1] - ys[-40]) / (xs[-1] - xs[-40])  # ms per token, compute-bound part
        lin = np.interp(t, xs, ys)
        past = t > xs[-1]
        lin[past] = ys[-1] + slope * (t[past] - xs[-1])
        self.m0 = float(ys[0])  # the flat floor: one read of the layer's weights
        self.slope = float(slope)
        self.lin = (LAYERS * lin + emb).tolist()
        if tp > 1:
            sx, sy = allreduce_table(hardware, tp)
            comm = 2 * LAYERS * np.interp(np.maximum(t, 1) * HIDDEN * 2, sx, sy)
        else:
            comm = np.zeros_like(t)
        self.comm = comm.tolist()
        self.kv_ms_per_token = KV_BYTES_PER_TOKEN / tp / (hw["hbm_gbps"] * 1e6 * HBM_EFFICIENCY)
        self.pf_ms_per_ctx = 4 * HIDDEN * LAYERS / tp / (hw["tflops"] * 1e9 * FLOPS_EFFICIENCY)
        self.host_ms_per_token = KV_BYTES_PER_TOKEN / (hw["host_gbps"] * 1e6)
        fixed, seq = calibration(hardware)
        self.fixed_ms = fixed
        self.seq_ms = seq * SPLITWISE_TP / tp
        self.max_tokens = max_tokens
        usable = tp * hw["mem_gib"] * 2**30 * 0.9 - WEIGHT_BYTES - tp * 4 * 2**30  # 4 GiB/GPU activations
        self.kv_capacity_tokens = max(0, int(usable / KV_BYTES_PER_TOKEN))

    def parts(self, tokens: int, decode_seqs: int, context: float, pf_ctx: float) -> tuple[float, float, float, float, float]:
        """Healthy ``(linear, kv/attention-memory, prefill-attention, comm, fixed)`` in ms."""
        T = min(tokens, self.max_tokens)
        return (self.lin[T], self.kv_ms_per_token * context + self.seq_ms * decode_seqs,
                self.pf_ms_per_ctx * pf_ctx, self.comm[T], self.fixed_ms)

    def step_ms(self, tokens: int, decode_seqs: int, context: float, pf_ctx: float,
                res: Resources = HEALTHY) -> float:
        """One step's time (ms) under ``res``."""
        T = min(tokens, self.max_tokens)
        lin = self.lin[T]
        mem = self.kv_ms_per_token * context + self.seq_ms * decode_seqs
        pf = self.pf_ms_per_ctx * pf_ctx
        if res is HEALTHY:
            return lin + mem + pf + self.comm[T] + self.fixed_ms
        c = self.slope * T
        roof = max(self.m0 * res.hbm, self.m0 * MEM_ISSUE_CLOCK * res.sm, c * res.sm) / max(self.m0, c)
        mem_x = max(res.hbm, MEM_ISSUE_CLOCK * res.sm)
        out = lin * roof + mem * mem_x + pf * res.sm + self.comm[T] * res.net + self.fixed_ms
        if res.prefill != 1.0 and T > 0:
            prefill_tokens = T - decode_seqs
            out += (res.prefill - 1.0) * (lin * roof * prefill_tokens / T + pf * res.sm)
        return out


#: The equal load at which :meth:`StepModel.throttle_factor` is solved: a decode step of this many
#: sequences, each with this many tokens of context (the drill's nodes run ~20-40 sequences of a
#: 1,000-token prompt plus their output). The fixed host part of a step is ~0.2 % of it, so the
#: measured drop at any other decode load is within 0.1 point of the target.
THROTTLE_REF_BATCH = 32
THROTTLE_REF_CONTEXT = 1200


@functools.lru_cache(maxsize=64)
def throttle_factor(model: StepModel, slowdown: float) -> float:
    """The clock multiplier ``s`` of a hard thermal throttle that makes a decode step at equal load
    (:data:`THROTTLE_REF_BATCH` sequences) take ``slowdown`` times as long, i.e. output tokens/s fall
    to ``1 / slowdown`` (seed 000: "throughput down 65 %": ``slowdown = 1 / 0.35``).

    A card that throttles hard lowers its SM clock and its memory clock together (HW slowdown), so
    ``s`` multiplies the SM-bound, the HBM-bound and the collective parts of the step (NCCL's
    all-reduce kernels run on the throttled card's SMs and memory, and every tensor-parallel rank
    waits for the slowest); the host-side ``fixed_ms`` does not slow. With ``sm = hbm = net = s`` the
    roofline ratio is exactly ``s``, so ``step(s) = s * (step - fixed) + fixed`` and
    ``s = (slowdown * step - fixed) / (step - fixed)`` at the reference load.
    """
    b = THROTTLE_REF_BATCH
    healthy = model.step_ms(b, b, b * THROTTLE_REF_CONTEXT, 0.0)
    return (slowdown * healthy - model.fixed_ms) / (healthy - model.fixed_ms)


@functools.lru_cache(maxsize=4)
def calibration(hardware: str = "h100") -> tuple[float, float]:
    """``(fixed_ms, seq_ms at tp=2)``: least squares of Splitwise's decode iteration times minus the
    profile-derived parts, against ``[1, batch]`` (A100 rows for ``a100``)."""
    sw = "a100-80gb" if hardware == "a100" else "h100-80gb"
    pts = [(b, tok) for p, b, _, tok in splitwise_points(sw) if p == 512]
    xs, ys, _ = linear_table(hardware, SPLITWISE_TP)
    sx, sy = allreduce_table(hardware, SPLITWISE_TP)
    kv = KV_BYTES_PER_TOKEN / SPLITWISE_TP / (HARDWARE[hardware]["hbm_gbps"] * 1e6 * HBM_EFFICIENCY)
    rows, rhs = [], []
    for b, tok in pts:
        lin = LAYERS * float(np.interp(b, xs, ys))
        comm = 2 * LAYERS * float(np.interp(b * HIDDEN * 2, sx, sy))
        rows.append([1.0, float(b)])
        rhs.append(tok - lin - comm - kv * b * SPLITWISE_CONTEXT)
    (fixed, seq), *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(rhs), rcond=None)
    return max(0.0, float(fixed)), max(0.0, float(seq))


@functools.lru_cache(maxsize=16)
def step_model(hardware: str = "h100", tp: int = 8, max_tokens: int = 8192 + 1024) -> StepModel:
    return StepModel(hardware, tp, max_tokens)
