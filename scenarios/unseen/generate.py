"""Generate the out-of-sample scenarios in this folder (issue 34): written once, committed before they
were scored, never tuned against.

    python scenarios/unseen/generate.py            # writes scenarios/unseen/unseen-NN.json
    python -m sim suite scenarios/unseen --out DIR --seeds 3 --cadence production --policies default

The random process (``numpy.random.default_rng(SEED)``, draws in this order per scenario):

- fault kind: uniform over :data:`KINDS` (every single-node fault kind the simulator has);
- magnitude ``m``: log-uniform on [1.2, 10] (the factor the fault slows the node by, mapped per kind
  in :func:`fault` below: a throttle's or link's slowdown, the growth of a resource's time, a KV cache
  keeping ``1/m`` of its blocks, a stall taking ``1 - 1/m`` of each period...);
- group size: log-uniform integer on [4, 64];
- load: requests/s per node uniform on [1.5, 5.5] (the shipped scenarios run 1.25-5.6);
- onset: uniform on [30, 120] s after the start; the fault ends, with probability 0.3, 30-90 s after its
  onset (uniform), else lasts to the end; the run lasts 150 s past the onset;
- the faulty node: uniform over the group; the scenario's seed: uniform on [1, 10**6).

The group, workload and client are those of the shipped 16-node scenarios (llama3-70b on h800 per
the vLLM step engine, the Azure LLM 2023 conversation trace, a 30 s client timeout, no retry).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

SEED = 34  # the number; fixed, so the set is the same every time it is generated
COUNT = 16
KINDS = ("thermal_throttle", "sm_throttle", "pcie_downgrade", "resource", "drift", "kv_swap", "ecc_replay",
         "kv_loss", "periodic_stall", "crash")
RESOURCES = ("sm_slowdown", "hbm_slowdown", "net_slowdown", "host_slowdown", "prefill_slowdown")
GROUP = "llama3-70b/h800"


def fault(kind: str, m: float, rng: np.random.Generator) -> dict:
    """The fault's own fields for magnitude ``m``."""
    if kind in ("thermal_throttle", "sm_throttle"):
        return {"slowdown": m}
    if kind == "pcie_downgrade":
        return {"decode_slowdown": m}
    if kind == "resource":
        return {str(rng.choice(RESOURCES)): m}
    if kind == "drift":
        return {"slowdown": m, "ramp_s": round(float(rng.uniform(30, 120)), 1)}
    if kind == "kv_swap":  # 1 + f * (inflight / max - 0.5) reaches m at a full node
        return {"swap_factor": round(2 * (m - 1), 3), "swap_threshold": 0.5}
    if kind == "ecc_replay":  # a (m - 1) s stall on a share of requests
        return {"stall_prob": round(float(rng.uniform(0.03, 0.15)), 3), "stall_ms": round(1000 * (m - 1))}
    if kind == "kv_loss":
        return {"fraction": round(1 - 1 / m, 4)}
    if kind == "periodic_stall":
        period = float(rng.uniform(2, 10))
        return {"period_s": round(period, 2), "stall_ms": round(1000 * period * (1 - 1 / m))}
    return {"error_after_ms": 5}  # crash: no magnitude


def scenario(i: int, rng: np.random.Generator) -> dict:
    kind = str(rng.choice(KINDS))
    m = round(float(math.exp(rng.uniform(math.log(1.2), math.log(10.0)))), 3)
    nodes = round(math.exp(rng.uniform(math.log(4), math.log(64))))
    rate = round(float(rng.uniform(1.5, 5.5)), 2)
    onset = round(float(rng.uniform(30, 120)), 1)
    ends = bool(rng.random() < 0.3)
    end = round(onset + float(rng.uniform(30, 90)), 1) if ends else None
    node = int(rng.integers(nodes))
    seed = int(rng.integers(1, 10**6))
    extra = fault(kind, m, rng)
    name = f"unseen-{i:02d}"
    return {
        "name": name, "seed": seed, "duration_s": round(onset + 150.0, 1),
        "groups": [{"name": GROUP, "nodes": nodes, "prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0,
                    "max_concurrency": 24, "jitter_cv": 0.08, "node_speed_spread": 0.03}],
        "workload": [{"group": GROUP, "rate_rps": round(rate * nodes, 1), "trace": "azure_llm_2023_conv",
                      "prompt_tokens": {"dist": "lognormal", "median": 1000, "sigma": 1.0, "max": 16000},
                      "completion_tokens": {"dist": "lognormal", "median": 180, "sigma": 0.9, "max": 2000}}],
        "client": {"timeout_s": 30, "retries": 0},
        "faults": [{"group": GROUP, "node": node, "kind": kind, "start_s": onset, "end_s": end, **extra}],
        "expect": {"faulty": [{"group": GROUP, "node": node}], "no_quarantine_of_healthy": True},
        "description": (f"Out-of-sample (scenarios/unseen/generate.py, seed {SEED}, #{i}): {kind} "
                        f"{'(no magnitude)' if kind == 'crash' else f'x{m}'} ({', '.join(extra)}) on node "
                        f"{node} of {nodes} at {rate} req/s per node, onset {onset} s"
                        + (f", ends {end} s" if end is not None else "") + "."),
    }


def main() -> None:
    rng = np.random.default_rng(SEED)
    here = Path(__file__).resolve().parent
    for i in range(COUNT):
        doc = scenario(i, rng)
        (here / f"{doc['name']}.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
