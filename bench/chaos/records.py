"""The chaos probe's records: batches of records with a unique ``request_id`` each, to ``--groups``
groups of ``--nodes`` loopback nodes; the ids a batch carries (the accounting checks each one landed
once), and what the gateways' POSTs were answered (:class:`HttpStats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

# ---------------------------------------------------------------------------------------- records


@dataclass
class Batch:
    no: int
    group: str
    n: int
    node_counts: dict[str, int]
    body: bytes = b""
    attempts: list[str] = field(default_factory=list)  # outcome of every attempt but the last 200/4xx
    attempt_times: list[float] = field(default_factory=list)  # when each of those was sent (wall)
    final_status: int | None = None
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[Any] = field(default_factory=list)


def node_id(group_index: int, node_index: int) -> str:
    """Loopback only: ``127.0.0.x:port``, unique across groups."""
    return f"127.0.0.{1 + node_index % 254}:{8000 + 10 * group_index + node_index // 254}"


def make_batch(no: int, tag: str, group: str, group_index: int, nodes: int, size: int,
               rng: np.random.Generator, now: float) -> Batch:
    """``size`` healthy records spread over the group's nodes (latency as in the test helpers:
    ``(prompt*0.25 + completion) * 20 ms`` with 8% noise), each with a run-unique ``request_id``."""
    p = rng.integers(50, 2000, size)
    c = rng.integers(20, 400, size)
    noise = rng.lognormal(0.0, 0.08, size)
    total = (p * 0.25 + c) * 20.0 * noise
    ttft = p * 0.25 * 20.0 * noise * 0.9
    ts = now - rng.uniform(0, 0.9, size)
    recs = []
    counts: Counter[str] = Counter()
    for k in range(size):
        node = node_id(group_index, (k + no) % nodes)
        counts[node] += 1
        recs.append({
            "ts": float(ts[k]), "node": node, "group": group, "prompt_tokens": int(p[k]),
            "completion_tokens": int(c[k]), "ttft_ms": float(ttft[k]), "total_ms": float(total[k]),
            "status": 200, "request_id": f"{tag}-{no}-{k}",
        })
    return Batch(no=no, group=group, n=size, node_counts=dict(counts), body=orjson.dumps(recs))


def batch_ids(tag: str, b: Batch) -> list[str]:
    return [f"{tag}-{b.no}-{k}" for k in range(b.n)]


@dataclass
class HttpStats:
    posts: int = 0
    status: Counter = field(default_factory=Counter)  # "200", "503", "conn:ReadTimeout", ...
    failures: list[float] = field(default_factory=list)  # wall times of non-200 answers
    post_ms: list[float] = field(default_factory=list)
