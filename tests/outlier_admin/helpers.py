"""Record generators shared by the pipeline tests: a group of nodes, one of them slower."""

from __future__ import annotations

import numpy as np


def make_records(
    t: float,
    *,
    group: str = "g1",
    nodes: int = 8,
    per_node: int = 40,
    slow: dict[int, float] | None = None,
    scale: float = 1.0,
    rng: np.random.Generator | None = None,
) -> list[dict]:
    """``per_node`` requests per node ending around ``t``. Latency = (prompt*0.25 + completion) * 20 ms
    * noise * ``scale`` (a surge slows everyone) * ``slow[i]`` (a gray node)."""
    rng = rng or np.random.default_rng(0)
    slow = slow or {}
    out = []
    for i in range(nodes):
        p = rng.integers(50, 2000, per_node)
        c = rng.integers(20, 400, per_node)
        noise = rng.lognormal(0.0, 0.08, per_node)
        factor = slow.get(i, 1.0) * scale
        total = (p * 0.25 + c) * 20.0 * noise * factor
        ttft = p * 0.25 * 20.0 * noise * factor * 0.9
        ts = t - rng.uniform(0, 0.9, per_node)
        for k in range(per_node):
            out.append({
                "ts": float(ts[k]), "node": f"127.0.0.1:{9000 + i}", "group": group,
                "prompt_tokens": int(p[k]), "completion_tokens": int(c[k]),
                "ttft_ms": float(ttft[k]), "total_ms": float(total[k]), "status": 200,
            })
    return out
