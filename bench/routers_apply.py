"""Publish-to-applied latency of the agent driving a real Envoy, Traefik and Caddy.

    python -m bench.routers_apply --out reports/bench-routers-apply.json

For each router (harness/routers.py, configured as docs/gateways.md says) in front of four fake
inference servers: an agent on the real Redis (``REDIS_URL``) with the router's applier, confirming
where the router lets it (Envoy's admin ``/clusters``, Traefik's API; Caddy's admin API answers a
PATCH once the new config runs). ``--n`` documents alternately quarantine and restore one node,
``--gap`` seconds apart (Traefik's apart by more than its 2 s provider throttle, or changes would
merge), each stamped ``generated_at = now`` just before the SET + PUBLISH. Per change the agent
records ``confirmed - generated_at``: the time from the control plane's publish to the router running
the change. Median, range and count per router are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import threading
import time
import uuid

from agent.caddy import CaddyApplier
from agent.client import GatewayClient, redis_from_url
from agent.core import Agent
from agent.envoy import EnvoyApplier
from agent.traefik import TraefikApplier
from bench.agent import write_report
from contract import keys
from harness.gateways import FakeInferenceServer, make_workdir, publish, weights_document
from harness.routers import CaddyRouter, EnvoyRouter, TraefikRouter, router_unavailable

#: Seconds between documents per router: Traefik applies a provider's change at most every 2 s.
DEFAULT_GAPS = {"envoy": 0.5, "traefik": 3.0, "caddy": 0.5}


def measure(kind: str, redis_client, addresses: dict[str, str], n: int, gap_s: float) -> dict:
    workdir = make_workdir(f"oa-bench-{kind}-")
    if kind == "envoy":
        router = EnvoyRouter(workdir, addresses)
        applier = EnvoyApplier(router.eds_path, "llm", admin_url=router.admin_url)
    elif kind == "traefik":
        router = TraefikRouter(workdir, addresses)
        applier = TraefikApplier(router.service_path, "llm", api_url=router.admin_url)
    else:
        router = CaddyRouter(workdir, addresses)
        applier = CaddyApplier(router.admin_url, "outlier-llm")
    group = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=5.0), applier)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # subscribed
        for version in range(1, n + 1):
            publish(redis_client, weights_document(group, version, addresses,
                                                   quarantined=("s3",) if version % 2 else ()))
            deadline = time.time() + gap_s + 15
            while agent.state.version != version and time.time() < deadline:
                time.sleep(0.005)
            time.sleep(gap_s)
    finally:
        stop.set()
        thread.join(timeout=10)
        router.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        redis_client.delete(keys.weights(group), keys.legacy_weights(group))
    ms = [lat * 1000 for _, lat in agent.change_latencies]
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 1) if ms else None,
            "min_ms": round(min(ms), 1) if ms else None, "max_ms": round(max(ms), 1) if ms else None,
            "apply_errors": agent.state.apply_errors, "gap_s": gap_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--n", type=int, default=7, help="documents per router (each a change)")
    p.add_argument("--routers", default="envoy,traefik,caddy")
    p.add_argument("--out", default="reports/bench-routers-apply.json")
    args = p.parse_args(argv)
    redis_client = redis_from_url(args.redis_url)
    servers = {f"s{i}": FakeInferenceServer(f"s{i}") for i in range(4)}
    addresses = {k: v.address for k, v in servers.items()}
    results = {}
    try:
        for kind in args.routers.split(","):
            reason = router_unavailable(kind)
            if reason:
                print(f"{kind}: skipped ({reason})")
                continue
            results[kind] = measure(kind, redis_client, addresses, args.n, DEFAULT_GAPS[kind])
            r = results[kind]
            print(f"{kind:8s} publish -> router runs it: median {r['median_ms']} ms "
                  f"(range {r['min_ms']}-{r['max_ms']} ms, {r['n']} changes, errors {r['apply_errors']})")
    finally:
        for srv in servers.values():
            srv.stop()
    write_report({"benchmark": "publish -> router running the change (agent confirmed)",
                  "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "load_avg_1m": os.getloadavg()[0]},
                  "params": {"n": args.n}, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
