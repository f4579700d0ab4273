"""LogShipper with a pluggable parser (default: every format, recognised per line), tail_file on an
nginx access log, retry on a failed POST."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.shipper import LogShipper, tail_file
from contract.logformats import nginx as nginx_format
from harness.gateways import free_port
from tests.conftest import FIXTURES

LINE = ('127.0.0.1 - - [03/Dec/2026:07:35:32 +0000] "POST /v1/completions HTTP/1.1" 200 180 "-" "-" 120 0.071 '
        '[outlier_llm] [] 127.0.0.1:{port} 180 0.070 200 {rid} prompt_tokens=12 completion_tokens=30 ttft_ms=7.4')


@contextlib.contextmanager
def serve_ingest(answer):
    """A stand-in for the ingest API on loopback: ``answer(authorization, records)`` gives the HTTP
    status of each POST; yields the URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code = answer(self.headers.get("Authorization", ""), body)
            out = json.dumps({"accepted": len(body), "rejected": 0, "duplicates": 0, "errors": []} if code == 200
                             else {"error": f"refused: {code}"}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/api/v1/ingest/requests"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def ingest_stub():
    """An ingest API that takes everything and records each POST (its bearer token and body)."""
    posts: list[tuple[str, list]] = []

    def take(auth: str, body: list) -> int:
        posts.append((auth, body))
        return 200

    with serve_ingest(take) as url:
        yield url, posts


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_tail_file_ships_new_complete_lines_and_follows_truncation(tmp_path, ingest_stub):
    url, posts = ingest_stub
    log = tmp_path / "access.log"
    log.write_text(LINE.format(port=9000, rid="old") + "\n")  # before the tail started: not shipped
    shipper = LogShipper(url, "secret", group="llm", parser=nginx_format.parse_line)
    stop = threading.Event()
    thread = threading.Thread(target=tail_file, args=(shipper, log, stop),
                              kwargs={"flush_interval_s": 0.05, "poll_s": 0.01,
                                      "start_offset": log.stat().st_size}, daemon=True)
    thread.start()
    try:
        with log.open("a") as fh:
            fh.write(LINE.format(port=9001, rid="r1") + "\n" + LINE.format(port=9002, rid="r2")[:40])
        assert wait_for(lambda: shipper.shipped == 1)
        time.sleep(0.1)
        assert shipper.shipped == 1  # the partial line waits for its newline
        with log.open("a") as fh:
            fh.write(LINE.format(port=9002, rid="r2")[40:] + "\nnot a log line\n")
        assert wait_for(lambda: shipper.shipped == 2)
        log.write_text(LINE.format(port=9003, rid="r3") + "\n")  # truncated and rewritten (rotation)
        assert wait_for(lambda: shipper.shipped == 3)
    finally:
        stop.set()
        thread.join(timeout=5)
    records = [rec for _, body in posts for rec in body]
    assert [r["node"] for r in records] == ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]
    assert all(auth == "Bearer secret" for auth, _ in posts)
    assert records[0] | {"ts": None} == {
        "ts": None, "node": "127.0.0.1:9001", "group": "llm", "prompt_tokens": 12.0, "completion_tokens": 30.0,
        "cached_tokens": None, "ttft_ms": 7.4, "total_ms": 70.0, "status": 200, "request_id": "r1"}
    assert shipper.rejected_by_reason == {"bad_format": 1}
    assert shipper.rejected[0] == ("bad_format", "not a log line")


def test_failed_post_keeps_records_and_retries(ingest_stub):
    url, posts = ingest_stub
    shipper = LogShipper(f"http://127.0.0.1:{free_port()}/api/v1/ingest/requests", "t", timeout_s=1,
                         parser=nginx_format.parse_line)
    assert shipper.feed(LINE.format(port=9001, rid="a")) and shipper.feed(LINE.format(port=9001, rid="b"))
    assert shipper.flush() == 0 and shipper.post_errors == 1 and len(shipper.buffer) == 2
    shipper.ingest_url = url  # the API is back
    assert shipper.flush() == 2 and not shipper.buffer
    assert [r["request_id"] for r in posts[0][1]] == ["a", "b"]  # order kept


def test_an_answer_the_api_will_never_change_does_not_block_the_records_behind_it():
    """Finding of the chaos probe: any 4xx was retried forever (HTTPError is a URLError), so one body
    the API refuses blocked every record after it. 413 now halves the batch, 400 drops the batch
    (counted), 401 keeps the records for a fixed token."""
    answers: list[int] = []

    def answer(auth: str, body: list) -> int:
        ids = [r["request_id"] for r in body]
        code = (401 if auth != "Bearer good" else 413 if len(body) > 2 else 400 if "poison" in ids else 200)
        answers.append(code)
        return code

    with serve_ingest(answer) as url:
        shipper = LogShipper(url, "bad", timeout_s=2, batch_size=500, parser=nginx_format.parse_line)
        for rid in ("a", "b", "poison", "c", "d"):
            assert shipper.feed(LINE.format(port=9001, rid=rid))
        assert shipper.flush() == 0 and len(shipper.buffer) == 5  # 401: kept until the token is fixed
        shipper.token = "good"
        assert shipper.flush() == 3  # 413 -> batches of 2: [a, b] 200, [poison, c] 400 dropped, [d] 200
        assert (shipper.dropped, len(shipper.buffer), shipper.batch_size) == (2, 0, 2)
        assert answers == [401, 413, 200, 400, 200]


def test_default_logs_of_every_gateway_with_no_configuration(ingest_stub):
    """The default parser reads each line's format: HAProxy's default httplog (keyed by address through
    the runtime API's map), nginx combined + upstream fields (as real HAProxy 2.6 and nginx 1.22 wrote
    them), Envoy's default text format, OpenAI-style JSON; lines without tokens ship latency-only."""
    url, posts = ingest_stub
    logs = FIXTURES / "gateway-logs"
    shipper = LogShipper(url, "t", node_map={"llm/s0": "127.0.0.1:9000", "llm/s1": "127.0.0.1:9001"})
    lines = [*(logs / "haproxy-2.6-httplog-default.log").read_text().splitlines(),
             *(logs / "nginx-1.22-upstream.log").read_text().splitlines(),
             (logs / "envoy-default-format-example.log").read_text().strip(),
             (logs / "openai-usage-accesslog.jsonl").read_text().splitlines()[0],
             (logs / "nginx-1.22-combined.log").read_text().splitlines()[0], "not a log line"]
    assert [shipper.feed(line) for line in lines] == [True] * 14 + [False, False]
    assert shipper.flush() == 14
    records = [rec for _, body in posts for rec in body]
    assert [r["node"] for r in records[:6]] == ["127.0.0.1:9000", "127.0.0.1:9001"] * 3
    assert [r["_format"] for r in records] == ["haproxy"] * 6 + ["nginx"] * 6 + ["envoy", "openai"]
    assert all(r["prompt_tokens"] is None for r in records[:13])
    assert (records[13]["prompt_tokens"], records[13]["cached_tokens"]) == (2006, 1920)
    assert shipper.rejected_by_format == {("no_upstream", "nginx"): 1, ("unrecognized_format", ""): 1}


def test_command_line_ships_a_file_in_any_format(tmp_path, ingest_stub):
    """``python -m agent.shipper --file --from-start``: default format auto, token from the
    environment, a node map for an nginx that logs no upstream; stopped by SIGTERM (by its pid)."""
    import os
    import signal
    import subprocess
    import sys

    url, posts = ingest_stub
    log = tmp_path / "access.log"
    log.write_text((FIXTURES / "gateway-logs" / "nginx-1.22-timed.log").read_text())
    env = {**os.environ, "OUTLIER_SHIPPER_TOKEN": "cli-token"}
    proc = subprocess.Popen([sys.executable, "-m", "agent.shipper", "--ingest-url", url, "--file",
                             str(log), "--from-start", "--group", "llm", "--node-map", "*=127.0.0.1:9005"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: sum(len(body) for _, body in posts) == 6, timeout_s=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    records = [rec for _, body in posts for rec in body]
    assert {(r["node"], r["group"], r["_format"], r["prompt_tokens"]) for r in records} == {
        ("127.0.0.1:9005", "llm", "nginx", None)}
    assert {auth for auth, _ in posts} == {"Bearer cli-token"} and proc.returncode == 0
