"""The measured data the simulator is calibrated on (copies in ``data/traces/``, see its README).

- Request traces (Azure LLM inference 2023 code/conv, Mooncake FAST'25 conversation): inter-arrival
  times and (prompt, completion) token pairs, in arrival order.
- Splitwise's measured iteration latencies (``splitwise_sim_perf_model.csv``): decode time per token as
  a function of batch size, the shape of the healthy cost model under load.
- Azure VM noise 2024 (TUNA): per-VM latency offsets of identical VMs, the real healthy peer spread.

Every loader is cached: a suite run parses each file once.
"""

from __future__ import annotations

import csv
import functools
import json
import os
from datetime import datetime
from pathlib import Path

import numpy as np

from detector.baseline import robust_sd

TRACE_FILES = {
    "azure_llm_2023_code": "azure_llm_2023_code.csv",
    "azure_llm_2023_conv": "azure_llm_2023_conv.csv",
    "mooncake_fast25_conversation_trace": "mooncake_fast25_conversation_trace.jsonl",
}
TRACE_NAMES = frozenset(TRACE_FILES)


def traces_dir() -> Path:
    """``$OA_TRACES_DIR`` or the repository's ``data/traces``."""
    env = os.environ.get("OA_TRACES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "data" / "traces"


@functools.lru_cache(maxsize=8)
def load_trace(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(inter_arrival_s, prompt_tokens, completion_tokens)`` of a request trace, in arrival order.

    ``inter_arrival_s[i]`` is the gap before request *i* (the first gap is the trace's mean gap, so a
    cycled trace has no zero-length seam). Token counts are clipped to >= 1.
    """
    path = traces_dir() / TRACE_FILES[name]
    if path.suffix == ".csv":
        ts: list[float] = []
        prompt: list[int] = []
        completion: list[int] = []
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                # 100 ns precision timestamps: trim to microseconds for strptime.
                stamp = row["TIMESTAMP"][:26]
                ts.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp())
                prompt.append(int(row["ContextTokens"]))
                completion.append(int(row["GeneratedTokens"]))
        t = np.asarray(ts, dtype=np.float64)
    else:
        t_ms: list[float] = []
        prompt, completion = [], []
        with path.open() as fh:
            for line in fh:
                rec = json.loads(line)
                t_ms.append(float(rec["timestamp"]))
                prompt.append(int(rec["input_length"]))
                completion.append(int(rec["output_length"]))
        t = np.asarray(t_ms, dtype=np.float64) / 1000.0
    order = np.argsort(t, kind="stable")
    t = t[order]
    gaps = np.diff(t, prepend=t[0])
    gaps[0] = (t[-1] - t[0]) / max(len(t) - 1, 1)
    return (
        gaps,
        np.maximum(np.asarray(prompt, dtype=np.int64)[order], 1),
        np.maximum(np.asarray(completion, dtype=np.int64)[order], 1),
    )


@functools.lru_cache(maxsize=1)
def splitwise_decode_curve(model: str = "llama2-70b", hardware: str = "h100-80gb") -> tuple[tuple[float, float], ...]:
    """Measured decode time per token against batch size, normalised to batch 1.

    Median ``token_time`` over repetitions and prompt sizes per batch size, divided by the batch-1
    median. For llama2-70b/h100 this is about 1.00 (1), 1.09 (8), 1.14 (16), 1.29 (32), 1.68 (64).
    """
    by_batch: dict[int, list[float]] = {}
    with (traces_dir() / "splitwise_sim_perf_model.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["model"] == model and row["hardware"] == hardware:
                by_batch.setdefault(int(row["batch_size"]), []).append(float(row["token_time"]))
    if not by_batch:
        raise KeyError(f"no Splitwise rows for {model}/{hardware}")
    batches = sorted(by_batch)
    med = [float(np.median(by_batch[b])) for b in batches]
    return tuple((float(b), m / med[0]) for b, m in zip(batches, med, strict=True))


@functools.lru_cache(maxsize=1)
def vm_noise_offsets() -> dict[str, np.ndarray]:
    """Per-VM log-latency offsets from the Azure VM noise 2024 data.

    ``"across"``: for each short-lived-VM file, ``log(value) - median(log(value))`` (one sample per fresh
    VM: the spread between identical machines). ``"within"``: for the long-lived VMs, the same centred on
    each VM's own median (one machine's drift over a year).
    """
    across: list[np.ndarray] = []
    within: list[np.ndarray] = []
    for path in sorted((traces_dir() / "azure_vm_noise_2024").glob("*.csv")):
        vals: list[float] = []
        vms: list[int] = []
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                v = float(row["value"])
                if v > 0:
                    vals.append(v)
                    vms.append(int(row["VM_id"]))
        logv = np.log(np.asarray(vals))
        if "__short_" in path.name:
            across.append(logv - np.median(logv))
        else:
            ids = np.asarray(vms)
            for vm in np.unique(ids):
                x = logv[ids == vm]
                within.append(x - np.median(x))
    return {"across": np.concatenate(across), "within": np.concatenate(within)}


def healthy_vm_offsets() -> np.ndarray:
    """Across-VM offsets within 3 robust sd of the median: the *healthy* heterogeneity.

    The tails of the data (VMs 2-3x slower than their peers) are exactly what a detector should flag,
    so they are not used to model healthy nodes.
    """
    v = vm_noise_offsets()["across"]
    sd = vm_noise_spread()["across"]
    return v[np.abs(v - np.median(v)) <= 3 * sd]


def vm_noise_spread() -> dict[str, float]:
    """Robust sd (1.4826*MAD) of the VM-noise offsets: ``{"across": ..., "within": ...}``.

    The MAD is used because the across-VM data has a few 2-3x outlier VMs that would dominate a plain sd.
    """
    out = {}
    for k, v in vm_noise_offsets().items():
        out[k] = robust_sd(v)
    return out
