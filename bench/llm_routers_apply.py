"""Publish-to-applied latency of the LLM-native routers: SGLang Model Gateway and vLLM router driven
by the agent, LiteLLM by its callback's filter.

    python -m bench.llm_routers_apply --out reports/bench-llm-routers-apply.json

smg, vllm-router (harness/routers_llm.py, round robin, in front of four fake inference servers): an
agent on the real Redis (``REDIS_URL``) with the router's applier; ``--n`` documents alternately
quarantine and restore one node, each stamped ``generated_at = now`` just before the SET + PUBLISH.
Per change two figures: the agent's (``generated_at`` -> its last call to the router returned) and
the router's (``generated_at`` -> the router's own worker list shows the change, polled every 5 ms).
smg's documents are 6 s apart: a removed worker drains for 5 s before it can be registered again.

litellm: the callback's :class:`agent.litellm_callback.DeploymentFilter` (the code the proxy runs,
in this process: the proxy adds nothing between its filter and its choice) watching the group;
``generated_at`` -> the first filter call that returns the new set, called every 1 ms.

Median, range and count per router are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import time
import uuid

from agent.client import GatewayClient, redis_from_url
from agent.core import Agent
from agent.litellm_callback import DeploymentFilter
from agent.smg import SmgApplier
from agent.vllm_router import VllmRouterApplier
from bench.agent import write_report
from contract import keys
from harness.gateways import FakeInferenceServer, make_workdir, publish, run_agent, weights_document
from harness.routers_llm import start_router

#: Seconds between documents: smg drains a removed worker for 5 s before it may be registered again.
DEFAULT_GAPS = {"smg": 6.0, "vllm-router": 1.0, "litellm": 0.5}
OUT = "s3"


def _summary(ms: list[float]) -> dict:
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 1) if ms else None,
            "min_ms": round(min(ms), 1) if ms else None, "max_ms": round(max(ms), 1) if ms else None}


def toggle_and_time(redis_client, group: str, addresses: dict[str, str], n: int, gap_s: float,
                    shows_out, *, timeout_s: float, poll_s: float) -> list[float]:
    """Publish ``n`` documents that alternately quarantine and restore :data:`OUT` and, after each, poll
    ``shows_out()`` (does the consumer now leave ``OUT`` out?) every ``poll_s`` until it agrees, for at
    most ``timeout_s``: the milliseconds from each document's ``generated_at`` to the agreement."""
    seen: list[float] = []
    for version in range(1, n + 1):
        out = version % 2 == 1
        doc = weights_document(group, version, addresses, quarantined=(OUT,) if out else ())
        publish(redis_client, doc)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if shows_out() == out:
                seen.append((time.time() - doc["generated_at"]) * 1000)
                break
            time.sleep(poll_s)
        time.sleep(gap_s)
    return seen


def measure_router(kind: str, redis_client, addresses: dict[str, str], n: int, gap_s: float) -> dict:
    workdir = make_workdir(f"oa-bench-{kind}-")
    router = start_router(kind, addresses, workdir, defence=False)
    cls = SmgApplier if kind == "smg" else VllmRouterApplier
    applier = cls(router.url, router_workers=[f"http://{a}" for a in addresses.values()])
    group = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=5.0), applier)
    stop, thread = run_agent(agent, resync_interval_s=30.0)
    try:
        time.sleep(0.3)  # subscribed
        seen = toggle_and_time(redis_client, group, addresses, n, gap_s,
                               lambda: addresses[OUT] not in (router.routable() or set()),
                               timeout_s=gap_s + 15, poll_s=0.005)
    finally:
        stop.set()
        thread.join(timeout=10)
        router.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        redis_client.delete(keys.weights(group), keys.legacy_weights(group))
    return {"agent": _summary([lat * 1000 for _, lat in agent.change_latencies]), "router": _summary(seen),
            "apply_errors": agent.state.apply_errors, "gap_s": gap_s}


def measure_litellm(redis_url: str, redis_client, addresses: dict[str, str], n: int, gap_s: float) -> dict:
    group = f"bench-litellm-{uuid.uuid4().hex[:8]}"
    deployments = [{"model_info": {"id": name}, "litellm_params": {"api_base": f"http://{addr}/v1"}}
                   for name, addr in addresses.items()]
    publish(redis_client, weights_document(group, 0, addresses))
    filt = DeploymentFilter(redis_url=redis_url, groups={"llama": group})
    try:
        filt.filter("llama", deployments)  # the watcher started
        time.sleep(0.3)
        seen = toggle_and_time(redis_client, group, addresses, n, gap_s,
                               lambda: OUT not in {d["model_info"]["id"] for d in filt.filter("llama", deployments)},
                               timeout_s=10, poll_s=0.001)
    finally:
        filt.close()
        redis_client.delete(keys.weights(group), keys.legacy_weights(group))
    return {"filter": _summary(seen), "gap_s": gap_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--n", type=int, default=7, help="documents per router (each a change)")
    p.add_argument("--routers", default="smg,vllm-router,litellm")
    p.add_argument("--out", default="reports/bench-llm-routers-apply.json")
    args = p.parse_args(argv)
    redis_client = redis_from_url(args.redis_url)
    servers = {f"s{i}": FakeInferenceServer(f"s{i}") for i in range(4)}
    addresses = {k: v.address for k, v in servers.items()}
    results: dict[str, dict] = {}
    try:
        for kind in args.routers.split(","):
            if kind == "litellm":
                r = results[kind] = measure_litellm(args.redis_url, redis_client, addresses, args.n,
                                                    DEFAULT_GAPS[kind])
                f = r["filter"]
                print(f"{kind:12s} publish -> callback filters by it: median {f['median_ms']} ms "
                      f"(range {f['min_ms']}-{f['max_ms']} ms, {f['n']} changes)")
                continue
            r = results[kind] = measure_router(kind, redis_client, addresses, args.n, DEFAULT_GAPS[kind])
            a, w = r["agent"], r["router"]
            print(f"{kind:12s} publish -> agent applied: median {a['median_ms']} ms (range {a['min_ms']}-"
                  f"{a['max_ms']} ms, {a['n']}); -> router's list shows it: median {w['median_ms']} ms "
                  f"(range {w['min_ms']}-{w['max_ms']} ms, {w['n']}); apply errors {r['apply_errors']}")
    finally:
        for srv in servers.values():
            srv.stop()
    write_report({"benchmark": "publish -> LLM router applying the change",
                  "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "load_avg_1m": os.getloadavg()[0]},
                  "params": {"n": args.n}, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
