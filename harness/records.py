"""Shared by the control-plane tests: record generators (a group of nodes, one of them slower) and a
local HTTP server standing in for a model server's or an exporter's endpoint."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) in a thread; yields ``http://127.0.0.1:<port>``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


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
