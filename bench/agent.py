"""Decision-to-apply latency: a weights document's ``generated_at`` -> the gateway has applied it.

    python -m bench.agent --out reports/bench-gateway-apply.json

Starts four fake inference servers, a real HAProxy (runtime API) and a real nginx (include + ``nginx
-t`` + reload) on loopback, one agent per gateway on the real Redis (``REDIS_URL``), then publishes
``--n`` documents that alternately quarantine and restore one node, ``--gap-ms`` apart, each stamped
``generated_at = now`` just before the SET + PUBLISH (what the control plane does at the end of a
tick). Each agent records, per version, ``apply finished - generated_at``; p50/p99/max are printed and
written as JSON. Same-host clocks, so no skew in these figures; in production add the clock offset
between control-plane and gateway hosts, and the tick's own time between its ``now`` and the publish.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import threading
import time
import uuid
from pathlib import Path

from agent.client import GatewayClient, effective_weights
from agent.core import Agent
from agent.haproxy import HAProxyApplier
from agent.nginx import NginxApplier, upstream_name_for
from contract import keys
from contract.topology import redis_from_url
from contract.weights_document import parse_document
from harness.gateways import (
    FakeInferenceServer,
    HAProxyProcess,
    NginxProcess,
    make_workdir,
    publish,
    weights_document,
)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarise(latencies_s: list[float]) -> dict[str, float]:
    """n, p50/p99 (nearest rank), max and mean in ms of latencies given in seconds (n=0: NaNs)."""
    ms = [v * 1000 for v in latencies_s]
    if not ms:
        nan = float("nan")
        return {"n": 0, "p50_ms": nan, "p99_ms": nan, "max_ms": nan, "mean_ms": nan}
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
            "max_ms": round(max(ms), 3), "mean_ms": round(sum(ms) / len(ms), 3)}


def write_report(report: dict, out: str | Path) -> None:
    """Write a benchmark report as JSON (creating its folder) and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def run(redis_url: str, n: int, gap_ms: float, nginx_n: int) -> dict:
    r = redis_from_url(redis_url)
    servers = {f"s{i}": FakeInferenceServer(f"s{i}", slowdown=3.0 if i == 3 else 1.0) for i in range(4)}
    addresses = {k: v.address for k, v in servers.items()}
    workdir = make_workdir("oa-gw-bench-")
    haproxy = HAProxyProcess(workdir / "haproxy", addresses, backend="llm")
    group = f"bench-{uuid.uuid4().hex[:8]}"
    include = workdir / "nginx-upstream.conf"
    upstream = upstream_name_for(group)
    NginxApplier(include, upstream, test_cmd=["true"], reload_cmd=["true"]).apply(
        effective_weights(parse_document(json.dumps(weights_document(group, 0, addresses))), time.time()))
    nginx = NginxProcess(workdir / "nginx", include, upstream)
    agents = {
        "haproxy": Agent(GatewayClient(r, group, poll_interval_s=5.0), HAProxyApplier(haproxy.socket_path, "llm")),
        "nginx": Agent(GatewayClient(r, group, poll_interval_s=5.0),
                       NginxApplier(include, upstream, test_cmd=nginx.test_cmd, reload_cmd=nginx.reload_cmd)),
    }
    stop = threading.Event()
    threads = [threading.Thread(target=a.run, args=(stop,), daemon=True) for a in agents.values()]
    for t in threads:
        t.start()
    try:
        total = max(n, nginx_n)
        for version in range(1, total + 1):
            quarantined = ("s3",) if version % 2 else ()
            publish(r, weights_document(group, version, addresses, quarantined=quarantined))
            # nginx needs time for -t + reload; keep its cadence realistic (a tick is seconds apart).
            time.sleep(gap_ms / 1000 if version <= nginx_n else 0.005)
        deadline = time.time() + 10
        while time.time() < deadline and any(a.state.version != total for a in agents.values()):
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        haproxy.stop()
        nginx.stop()
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        r.delete(keys.weights(group), keys.legacy_weights(group))
    result = {}
    for name, agent in agents.items():
        lat = [v for _, v in agent.apply_latencies]
        limit = n if name == "haproxy" else nginx_n
        lat = [v for ver, v in agent.apply_latencies if ver <= limit] or lat
        result[name] = summarise(lat) | {"apply_errors": agent.state.apply_errors,
                                          "versions_seen": len(agent.apply_latencies)}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--n", type=int, default=300, help="documents published (HAProxy measured on all)")
    p.add_argument("--nginx-n", type=int, default=40, help="of which the first N are spaced for nginx")
    p.add_argument("--gap-ms", type=float, default=250.0, help="spacing of the nginx-paced documents")
    p.add_argument("--out", default="reports/bench-gateway-apply.json")
    args = p.parse_args(argv)
    t0 = time.time()
    result = run(args.redis_url, args.n, args.gap_ms, args.nginx_n)
    report = {"benchmark": "gateway decision-to-apply latency (generated_at -> applied)",
              "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "params": {"n": args.n, "nginx_n": args.nginx_n, "gap_ms": args.gap_ms},
              "results": result, "wall_s": round(time.time() - t0, 1)}
    for name, res in result.items():
        print(f"{name:8s} n={res['n']:4d} p50={res['p50_ms']:.2f} ms p99={res['p99_ms']:.2f} ms "
              f"max={res['max_ms']:.2f} ms errors={res['apply_errors']}")
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
