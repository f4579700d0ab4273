"""Model-server scraper benchmark (issue 18, "scraping"): nodes held at 4 Hz by one process.

    DJANGO_DEBUG=1 REDIS_URL=redis://127.0.0.1:6379/7 .venv/bin/python -m bench.scraper \\
        --out reports/bench-scraper.json

One server process on 127.0.0.1 (a bare asyncio HTTP/1.1 keep-alive server, so that it costs little
of the machine's CPU next to the scraper) serves real-size vLLM V1 pages: the simulator's page
(:class:`sim.metrics.EngineMetrics`, vLLM's bucket edges) plus the other families a vLLM
V1 server exposes (request decode / inference time, generation and computed tokens, iteration
tokens, request parameters, process and Python series), with ``--engines`` data-parallel label sets
(1 engine: about 30 KB). Each node is its own path, whose counters move at every request.

This process runs :meth:`outlier_admin.ingest.scraper.Scraper.run` (the ``scrape_metrics`` loop, rows
written to Redis, no lease) over N nodes for a window, for N in ``--nodes`` (ascending, stops at the
first N not held). N is **held** when every node got at least 90 % of its slots (one per period;
the slots skipped over all nodes are reported too). Figures per N: scrapes/s, CPU of this process per node
(ms of CPU per node per second) and per scrape (µs), slot lag p50 / p99, the server's CPU; and the
parse time of one page by :func:`detector.engine_metrics.parse` against ``prometheus_client``'s full
parser. On a shared machine the N held is bounded by the CPU the process was given
(``cpu_core_fraction``, ``load_avg_1m``); ``nodes_per_core_at_cadence_from_cpu`` is what one whole
core would hold at the measured CPU cost of a scrape. Prints and writes JSON; asserts nothing.

``run(...) -> dict`` is what ``bench.fastpath`` calls; its key
``scrape_nodes_per_process_4hz`` is the largest N held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import statistics
import time
import timeit
from pathlib import Path
from typing import Any

from contract import keys

VARIANTS = 64  # pages per node cycle through these (counters grow; a wrap reads as a restart)
GROUP_SIZE = 100  # nodes per benchmark group (bench-scrape-<k>)
_PATH = re.compile(rb"^GET /(n|dead)/(\d{1,6})/metrics HTTP/1\.[01]\r\n", re.ASCII)

_EXTRA_HISTOGRAMS = (  # (name, buckets key, help): vLLM V1 families the scraper does not read
    ("vllm:request_decode_time_seconds", "request", "Histogram of time spent in DECODE phase for request."),
    ("vllm:request_inference_time_seconds", "request", "Histogram of time spent in RUNNING phase for request."),
    ("vllm:request_time_per_output_token_seconds", "itl", "Histogram of time_per_output_token_seconds per request."),
    ("vllm:request_generation_tokens", "tokens", "Number of generation tokens processed."),
    ("vllm:request_max_num_generation_tokens", "tokens", "Histogram of maximum number of requested generation tokens."),
    ("vllm:request_params_n", "params", "Histogram of the n request parameter."),
    ("vllm:request_params_max_tokens", "tokens", "Histogram of the max_tokens request parameter."),
    ("vllm:iteration_tokens_total", "iteration", "Histogram of number of tokens per engine_step."),
    ("vllm:request_prefill_kv_computed_tokens", "tokens", "Histogram of new KV tokens computed during prefill."),
)


def vllm_page(engines: int = 1, step: int = 0) -> str:
    """A real-size vLLM V1 ``/metrics`` page of ``engines`` engines after ``step`` scrape periods
    (every counter grows with ``step``; 50 tokens at 20 ms and one 2,000-token prefill per step)."""
    from sim.metrics import ITL_BUCKETS, PROMPT_BUCKETS, REQUEST_BUCKETS, EngineMetrics

    buckets = {"request": REQUEST_BUCKETS, "itl": ITL_BUCKETS, "tokens": PROMPT_BUCKETS,
               "params": (1, 2, 5, 10, 20), "iteration": (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)}
    out = ["# HELP python_gc_objects_collected_total Objects collected during gc",
           "# TYPE python_gc_objects_collected_total counter"]
    out += [f'python_gc_objects_collected_total{{generation="{g}"}} {1000.0 * (g + 1) + step}' for g in range(3)]
    out += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# TYPE process_resident_memory_bytes gauge", "process_resident_memory_bytes 4.2e+09",
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
            "# TYPE process_cpu_seconds_total counter", f"process_cpu_seconds_total {100.0 + step}"]
    for e in range(engines):
        m = EngineMetrics()
        n = 1000 + 50 * step
        m.itl.observe(0.02, n)
        m.ttft.observe(0.3, 20 + step)
        m.prefill.observe(0.25, 20 + step)
        m.queue.observe(0.05, 20 + step)
        m.e2e.observe(4.0, 10 + step)
        m.prompt.observe(2000, 20 + step)
        m.prompt_tokens, m.generation_tokens = 2000 * (20 + step), n
        m.cache_queries, m.cache_hits = 2000 * (20 + step), 500 * (20 + step)
        m.running, m.waiting, m.kv_usage = 12, 1, 0.4
        page = m.render(model_name="meta-llama/Llama-3.1-70B-Instruct")
        out.append(page.replace('engine="0"', f'engine="{e}"').rstrip("\n"))
        labels = f'engine="{e}",model_name="meta-llama/Llama-3.1-70B-Instruct"'
        for name, key, help_text in _EXTRA_HISTOGRAMS:
            edges = buckets[key]
            mid, n = len(edges) // 2, 10 + step  # n samples in the middle bucket
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            out += [f'{name}_bucket{{{labels},le="{float(e)}"}} {float(n if i >= mid else 0)}'
                    for i, e in enumerate(edges)]
            out += [f'{name}_bucket{{{labels},le="+Inf"}} {float(n)}', f"{name}_sum{{{labels}}} {edges[mid] * n!r}",
                    f"{name}_count{{{labels}}} {float(n)}"]
    return "\n".join(out) + "\n"


def _response(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


class _Http(asyncio.Protocol):
    """GET /n/<i>/metrics: node i's next page; GET /dead/<i>/metrics: never answered. Keep-alive."""

    def __init__(self, pages: list[bytes], counters: dict[int, int]) -> None:
        self.pages, self.counters, self.buf = pages, counters, b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 65536:  # not a scraper's request
            self.transport.close()
            return
        while (end := self.buf.find(b"\r\n\r\n")) != -1:
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            m = _PATH.match(head + b"\r\n")
            if m is None:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            if m[1] == b"dead":
                continue  # hold the connection, answer nothing
            i = int(m[2])
            k = self.counters.get(i, i % VARIANTS)
            self.counters[i] = k + 1
            self.transport.write(self.pages[k % VARIANTS])


async def _serve(pages: list[bytes], ports: int, started: Any, stop_after_s: float) -> None:
    loop = asyncio.get_running_loop()
    counters: dict[int, int] = {}
    servers = [await loop.create_server(lambda: _Http(pages, counters), "127.0.0.1", 0, backlog=4096)
               for _ in range(ports)]
    started.put([s.sockets[0].getsockname()[1] for s in servers])
    await asyncio.sleep(stop_after_s)


def start_server_thread(pages: list[bytes], ports: int = 1) -> tuple[list[int], Any]:
    """The same server in a daemon thread of this process (tests); returns ``(ports, stop)``."""
    import queue
    import threading

    started: queue.Queue = queue.Queue()
    loop = asyncio.new_event_loop()
    task: list[asyncio.Task] = []

    def main() -> None:
        task.append(loop.create_task(_serve(pages, ports, started, 3600.0)))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])
        loop.close()

    threading.Thread(target=main, name="page-server", daemon=True).start()
    bound = started.get(timeout=30)
    return bound, lambda: loop.call_soon_threadsafe(task[0].cancel)


def _server_main(engines: int, ports: int, started: Any, stop_after_s: float) -> None:
    pages = [_response(vllm_page(engines, step).encode()) for step in range(VARIANTS)]
    asyncio.run(_serve(pages, ports, started, stop_after_s))


def start_server(engines: int = 1, ports: int = 4, stop_after_s: float = 3600.0) -> tuple[Any, list[int]]:
    """A page server in its own process; returns ``(process, ports)`` (terminate the process)."""
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Queue()
    proc = ctx.Process(target=_server_main, args=(engines, ports, started, stop_after_s), daemon=True)
    proc.start()
    return proc, started.get(timeout=120)


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc (0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def parse_figures(engines: tuple[int, ...] = (1, 4)) -> dict[str, Any]:
    """µs to read one page: :func:`detector.engine_metrics.parse` and prometheus_client's full parser."""
    from prometheus_client.parser import text_string_to_metric_families

    from detector.engine_metrics import parse

    out: dict[str, Any] = {}
    for n in engines:
        text = vllm_page(n, 3)

        def best(fn: Any, number: int) -> float:
            return round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 1)

        out[f"engines_{n}"] = {
            "bytes": len(text), "lines": text.count("\n"),
            "parse_us": best(lambda text=text: parse(text), 200),
            "full_parser_us": best(lambda text=text: list(text_string_to_metric_families(text)), 5),
        }
    return out


async def _hold(urls: list[str], seconds: float, warmup_s: float, interval_s: float,
                timeout_s: float) -> dict[str, Any]:
    from outlier_admin.ingest.scraper import Scraper, Target

    targets = [Target(f"bench-scrape-{i // GROUP_SIZE}", f"127.0.0.1:{20000 + i}", url) for i, url in enumerate(urls)]
    scraper = Scraper(interval_s=interval_s, timeout_s=timeout_s, max_connections=max(len(urls) + 16, 64))
    stop = asyncio.Event()
    task = asyncio.create_task(scraper.run((0, 1), stop=stop, refresh_s=3600.0, load=lambda _s: targets,
                                           lease=False))
    await asyncio.sleep(warmup_s)
    s0, by0, skipped0, parse0 = scraper.stats.scrapes, dict(scraper.stats.by_node), scraper.stats.skipped, \
        scraper.stats.parse_s
    scraper.stats.lags.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = scraper.stats.scrapes - s0
    per_node = [scraper.stats.by_node.get((t.group, t.node), 0) - by0.get((t.group, t.node), 0) for t in targets]
    skipped = scraper.stats.skipped - skipped0
    lags = sorted(scraper.stats.lags)
    parse_s = scraper.stats.parse_s - parse0
    stop.set()
    await task
    slots = wall / interval_s
    worst = min(per_node) / slots if per_node else 0.0
    return {
        "nodes": len(urls), "seconds": round(wall, 2), "scrapes_per_s": round(done / wall, 1),
        "worst_node_slots_fraction": round(worst, 3), "skipped_fraction": round(skipped / max(done + skipped, 1), 4),
        "held": worst >= 0.9,
        "cpu_core_fraction": round(cpu / wall, 3),
        "cpu_ms_per_node_per_s": round(cpu / wall / len(urls) * 1000, 3),
        "cpu_us_per_scrape": round(cpu / max(done, 1) * 1e6, 1),
        "parse_wall_us_per_scrape": round(parse_s / max(done, 1) * 1e6, 1),
        "lag_ms": {"p50": round(statistics.median(lags) * 1000, 2) if lags else None,
                   "p99": round(lags[int(0.99 * (len(lags) - 1))] * 1000, 2) if lags else None},
        "failures": dict(scraper.stats.failures), "rows": scraper.stats.rows,
    }


def _cleanup(nodes: int) -> None:
    from outlier_admin.control.redis_conn import get_redis

    r = get_redis()
    groups = [f"bench-scrape-{k}" for k in range((nodes + GROUP_SIZE - 1) // GROUP_SIZE)]
    if groups:
        r.delete(*[keys.stream(g) for g in groups], *[keys.itl(g) for g in groups])


def run(nodes: tuple[int, ...] = (50, 100, 250, 500, 750, 1000), *, seconds: float = 10.0, warmup_s: float = 3.0,
        engines: int = 1, interval_s: float = 0.25, timeout_s: float = 0.8, ports: int = 8) -> dict[str, Any]:
    """Nodes held at ``1/interval_s`` Hz by one scraper process (see module docstring); returns
    ``{"scrape_nodes_per_process_4hz": n, "steps": [...], "parse": {...}, ...}``. Needs Django set up
    and ``REDIS_URL`` (writes the streams of groups ``bench-scrape-*`` and deletes them after)."""
    proc, server_ports = start_server(engines, ports)
    steps: list[dict[str, Any]] = []
    try:
        for n in sorted(nodes):
            urls = [f"http://127.0.0.1:{server_ports[i % len(server_ports)]}/n/{i}/metrics" for i in range(n)]
            srv0 = _proc_cpu_s(proc.pid)
            step = asyncio.run(_hold(urls, seconds, warmup_s, interval_s, timeout_s))
            step["server_cpu_core_fraction"] = round((_proc_cpu_s(proc.pid) - srv0) / (seconds + warmup_s), 3)
            _cleanup(n)
            steps.append(step)
            print(f"{n:5d} nodes: {step['scrapes_per_s']:7.1f} scrapes/s, held={step['held']}, "
                  f"worst node {step['worst_node_slots_fraction']:.0%} of slots, "
                  f"cpu {step['cpu_core_fraction']:.2f} core ({step['cpu_us_per_scrape']:.0f} us/scrape, "
                  f"parse {step['parse_wall_us_per_scrape']:.0f} us wall), lag p50/p99 {step['lag_ms']['p50']}/"
                  f"{step['lag_ms']['p99']} ms, server {step['server_cpu_core_fraction']:.2f} core", flush=True)
            if not step["held"]:
                break
    finally:
        proc.terminate()
        proc.join(10)
    held = [s["nodes"] for s in steps if s["held"]]
    # What one whole core would hold at this CPU cost a scrape (the machine may be shared: the
    # measured N is bounded by the CPU this process was given, cpu_core_fraction).
    cost = min((s["cpu_us_per_scrape"] for s in steps if s["scrapes_per_s"] > 0), default=0.0)
    page = parse_figures((engines, 4) if engines != 4 else (engines,))
    print("parse:", json.dumps(page))
    return {
        "scrape_nodes_per_process_4hz": max(held) if held else 0,
        "nodes_per_core_at_cadence_from_cpu": int(1e6 / (cost / interval_s)) if cost else None,
        "interval_s": interval_s, "engines": engines, "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "steps": steps, "parse": page,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="50,100,250,500,750,1000", help="comma-separated node counts, ascending")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per node count")
    parser.add_argument("--engines", type=int, default=1, help="data-parallel engines per page (label sets)")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    import django

    django.setup()
    nodes = tuple(int(x) for x in args.nodes.split(",") if x.strip())
    if not nodes or min(nodes) < 1 or max(nodes) > 20_000 or not 1 <= args.engines <= 64 or not 1 <= args.seconds <= 600:
        parser.error("--nodes 1..20000, --engines 1..64, --seconds 1..600")
    figures = run(nodes, seconds=args.seconds, engines=args.engines)
    print(json.dumps({k: v for k, v in figures.items() if k != "steps"}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
