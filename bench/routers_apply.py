"""Publish-to-applied latency of the agent driving a real Envoy, Traefik and Caddy.

    python -m bench.routers_apply --runs 3 --out reports/bench-routers-apply.json
    python -m bench.routers_apply --table reports/bench-routers-apply.json   # docs/gateways.md's table

For each router (harness/routers.py, configured as docs/gateways.md says) in front of four fake
inference servers: an agent on the real Redis (``REDIS_URL``) with the router's applier, confirming
where the router lets it (Envoy's admin ``/clusters``, Traefik's API; Caddy's admin API answers a
PATCH once the new config runs). ``--n`` documents alternately quarantine and restore one node,
``--gap`` seconds apart (Traefik's apart by more than its 2 s provider throttle, or changes would
merge), each stamped ``generated_at = now`` just before the SET + PUBLISH. Per change the agent
records ``confirmed - generated_at``: the time from the control plane's publish to the router running
the change. ``--runs`` repeats it (a fresh router and agent each time); the median and range over
every change of every run, and each run's median, are printed and written as JSON, and ``--table``
prints the markdown table of docs/gateways.md from that JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
import uuid
from pathlib import Path

from agent.caddy import CaddyApplier
from agent.client import GatewayClient, redis_from_url
from agent.core import Agent
from agent.envoy import EnvoyApplier
from agent.traefik import TraefikApplier
from bench.agent import write_report
from contract import keys
from harness.gateways import FakeInferenceServer, make_workdir, publish, run_agent, weights_document
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
    stop, thread = run_agent(agent, resync_interval_s=30.0)
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
    return {"changes_ms": [round(lat * 1000, 1) for _, lat in agent.change_latencies],
            "apply_errors": agent.state.apply_errors}


def summarise(runs: list[dict], gap_s: float) -> dict:
    """Median and range over every change of every run, and each run's median."""
    ms = [v for r in runs for v in r["changes_ms"]]
    return {"runs": len(runs), "n": len(ms), "median_ms": round(statistics.median(ms), 1) if ms else None,
            "min_ms": min(ms) if ms else None, "max_ms": max(ms) if ms else None,
            "run_medians_ms": [round(statistics.median(r["changes_ms"]), 1) for r in runs if r["changes_ms"]],
            "apply_errors": sum(r["apply_errors"] for r in runs), "gap_s": gap_s, "changes_ms": ms}


BOUNDS = {"envoy": "inotify on the rename, Envoy's EDS update",
          "caddy": "a graceful config reload",
          "traefik": "`providersThrottleDuration` (2 s by default)"}
NAMES = {"envoy": "Envoy 1.40 (filesystem EDS)", "caddy": "Caddy 2.11 (admin API)",
         "traefik": "Traefik 3.7 (file provider)"}


def table(report: dict) -> str:
    """docs/gateways.md's table from a report."""
    rows = ["| router | median | range | changes (runs) | what bounds it |", "|---|---|---|---|---|"]
    for kind, r in report["results"].items():
        fmt = (lambda v: f"{v / 1000:.1f} s") if r["median_ms"] >= 1000 else (lambda v: f"{v:.0f} ms")
        rows.append(f"| {NAMES[kind]} | {fmt(r['median_ms'])} | {fmt(r['min_ms'])}-{fmt(r['max_ms'])} | "
                    f"{r['n']} ({r['runs']}) | {BOUNDS[kind]} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--n", type=int, default=7, help="documents per router (each a change)")
    p.add_argument("--runs", type=int, default=3, help="fresh router and agent each run")
    p.add_argument("--routers", default="envoy,traefik,caddy")
    p.add_argument("--out", default="reports/bench-routers-apply.json")
    p.add_argument("--table", metavar="JSON", help="print docs/gateways.md's table from a report and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
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
            runs = [measure(kind, redis_client, addresses, args.n, DEFAULT_GAPS[kind]) for _ in range(args.runs)]
            r = results[kind] = summarise(runs, DEFAULT_GAPS[kind])
            print(f"{kind:8s} publish -> router runs it: median {r['median_ms']} ms (range {r['min_ms']}-"
                  f"{r['max_ms']} ms, {r['n']} changes in {r['runs']} runs, run medians {r['run_medians_ms']}, "
                  f"errors {r['apply_errors']})")
    finally:
        for srv in servers.values():
            srv.stop()
    write_report({"benchmark": "publish -> router running the change (agent confirmed)",
                  "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "load_avg_1m": os.getloadavg()[0]},
                  "params": {"n": args.n, "runs": args.runs}, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
