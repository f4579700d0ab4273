"""The scraper on engines other than vLLM (outlier_admin.ingest.scraper): llama.cpp's /slots read beside
its /metrics (same scheme, host and port; slots off; a refused document), a stalled node's row, and a
page no engine wrote counted as ``unrecognised_engine`` and shown on the node's page. Real Redis and
PostgreSQL; local HTTP servers on 127.0.0.1 serve the captured llama.cpp pages."""

from __future__ import annotations

import asyncio
from http.server import BaseHTTPRequestHandler

import orjson
import pytest
import yarl
from django.test import Client

from contract import keys
from detector.engine_metrics import ROW_FIELDS
from detector.engines.llamacpp import MAX_SLOTS
from harness.records import http_server
from outlier_admin.ingest.scraper import SLOTS_RETRY_S, Scraper, Target, slots_url
from outlier_admin.observability.metrics import EVENTS
from tests.conftest import FIXTURES
from tests.outlier_admin.api.conftest import users  # noqa: F401

LC = FIXTURES / "llamacpp"


class LlamaCpp(BaseHTTPRequestHandler):
    """Serves ``pages[path]`` (the next body of its list at each GET, the last one repeated); a path
    not listed answers 404. ``status[path]`` overrides 200. Every GET's path is logged in ``seen``."""

    pages: dict[str, list[bytes]] = {}
    status: dict[str, int] = {}
    seen: list[str] = []

    def do_GET(self):
        cls = type(self)
        cls.seen.append(self.path)
        bodies = cls.pages.get(self.path)
        if bodies is None:
            body, code = b"not found", 404
        else:
            body = bodies.pop(0) if len(bodies) > 1 else bodies[0]
            code = cls.status.get(self.path, 200)
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def llamacpp():
    LlamaCpp.pages, LlamaCpp.status, LlamaCpp.seen = {}, {}, []
    with http_server(LlamaCpp) as url:
        yield url


def fixture(name: str) -> bytes:
    return (LC / name).read_bytes()


def stream_rows(redis_client, group: str) -> list[dict]:
    return [dict(zip(ROW_FIELDS, row, strict=True)) for _id, fields in redis_client.xrange(keys.stream(group))
            for row in orjson.loads(fields[b"progress"])]


def failures(group: str, node: str, kind: str) -> float:
    return EVENTS.get_sample_value("outlier_scrape_failures_total", {"group": group, "node": node, "kind": kind}) or 0.0


def test_slots_url_keeps_the_operators_scheme_host_port_and_path_prefix():
    assert str(slots_url(yarl.URL("http://127.0.0.1:8080/metrics"))) == "http://127.0.0.1:8080/slots"
    assert str(slots_url(yarl.URL("https://127.0.0.1:8443/llama/metrics?x=1"))) == "https://127.0.0.1:8443/llama/slots"
    assert str(slots_url(yarl.URL("http://127.0.0.1:8080/prom"))) == "http://127.0.0.1:8080/slots"


@pytest.mark.django_db
def test_a_llamacpp_node_is_read_through_its_slots(llamacpp, redis_client):
    LlamaCpp.pages = {"/lc/metrics": [fixture("metrics_a.txt"), fixture("metrics_b.txt")],
                      "/lc/slots": [fixture("slots_a.json"), fixture("slots_b.json")]}
    t = Target("g", "127.0.0.1:8080", f"{llamacpp}/lc/metrics")
    scraper = Scraper(redis_client, interval_s=0.25, timeout_s=2.0)
    assert asyncio.run(scraper.round([t])) == 0  # the first scrape sets the base
    assert asyncio.run(scraper.round([t])) == 1
    assert LlamaCpp.seen == ["/lc/metrics", "/lc/slots"] * 2
    (row,) = stream_rows(redis_client, "g")
    # The captures' numbers: task 4 decoded 6 tokens over the whole interval (one stream), task 5's
    # 90-token prompt finished in it, 297 ms by the prompt counters.
    assert row["tokens"] == 6 and row["token_ms"] == pytest.approx(row["interval_s"] * 1000.0)
    assert (row["prefills"], row["prefill_ms"], row["prefill_tokens"]) == (1, pytest.approx(296.983), 90)
    # The snapshot is kept with the counters, so another process continues the same series.
    # Each slot carries what the rows counted of its task (task 4: 6 tokens over the interval), so the
    # finished-request counters add only the rest when it ends.
    stored = orjson.loads(redis_client.hget(keys.itl("g"), t.node))
    interval_ms = row["interval_s"] * 1000.0
    assert stored[-3] == "llamacpp"
    assert stored[-2][0][:5] == [0, 4, 165, 90, 6] and stored[-2][0][5] == pytest.approx(interval_ms)
    assert stored[-2][1] == [1, 5, 5, 90, 0, 0.0]
    assert stored[-1] == [0.0, 0.0]  # no request ended: the finished counters owe nothing
    again = Scraper(redis_client).read_prev([t])[("g", t.node)][1].slots
    assert again[1] == (1, 5, 5, 90, 0, 0.0) and again[0][:5] == (0, 4, 165, 90, 6)


@pytest.mark.django_db
def test_a_stalled_llamacpp_node_gives_a_row_with_time_and_no_token(llamacpp, redis_client):
    LlamaCpp.pages = {"/lc/metrics": [fixture("metrics_b.txt")], "/lc/slots": [fixture("slots_b.json")]}
    t = Target("g", "127.0.0.1:8080", f"{llamacpp}/lc/metrics")
    scraper = Scraper(redis_client, timeout_s=2.0)
    for _ in range(2):
        asyncio.run(scraper.round([t]))
    (row,) = stream_rows(redis_client, "g")  # queued, not dropped as idle: a censored observation
    assert row["tokens"] == 0 and row["token_ms"] == pytest.approx(2 * row["interval_s"] * 1000.0)
    assert row["running"] == 2


@pytest.mark.django_db
def test_slots_off_falls_back_to_the_counters_and_is_asked_again_only_rarely(llamacpp, redis_client, monkeypatch):
    LlamaCpp.pages = {"/lc/metrics": [fixture("metrics_a.txt")], "/lc/slots": [fixture("slots_501.json")]}
    LlamaCpp.status = {"/lc/slots": 501}  # a server started with --no-slots
    t = Target("g", "127.0.0.1:8080", f"{llamacpp}/lc/metrics")
    before = sum(failures("g", t.node, k) for k in ("http_status", "parse"))
    scraper = Scraper(redis_client, timeout_s=2.0)
    for _ in range(3):
        asyncio.run(scraper.round([t]))
    assert LlamaCpp.seen == ["/lc/metrics", "/lc/slots", "/lc/metrics", "/lc/metrics"]
    assert sum(failures("g", t.node, k) for k in ("http_status", "parse")) == before  # a setting, not a fault
    assert scraper.stats.scrapes == 3 and orjson.loads(redis_client.hget(keys.itl("g"), t.node))[-1] is None
    # A finished request moves the counters: a (late) row from them alone.
    LlamaCpp.pages["/lc/metrics"] = [fixture("metrics_a.txt").replace(b"tokens_predicted_total 160",
                                                                      b"tokens_predicted_total 360")
                                     .replace(b"tokens_predicted_seconds_total 7.22483",
                                              b"tokens_predicted_seconds_total 16.9239")]
    assert asyncio.run(scraper.round([t])) == 1
    (row,) = stream_rows(redis_client, "g")
    assert row["tokens"] == 200 and row["token_ms"] == pytest.approx(9699.07)
    # After SLOTS_RETRY_S the server is asked again.
    import time as _time
    now = _time.monotonic()
    monkeypatch.setattr("outlier_admin.ingest.scraper.time.monotonic", lambda: now + SLOTS_RETRY_S + 1)
    asyncio.run(scraper.round([t]))
    assert LlamaCpp.seen[-1] == "/lc/slots"


@pytest.mark.django_db
def test_the_beat_rounds_remember_slots_off_too(llamacpp, redis_client, monkeypatch):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.ingest import scraper as module

    monkeypatch.setattr(module, "_ROUND_SLOTS_OFF", {})
    LlamaCpp.pages = {"/lc/metrics": [fixture("metrics_a.txt")], "/lc/slots": [fixture("slots_501.json")]}
    LlamaCpp.status = {"/lc/slots": 501}
    do_register_node(do_create_group("g", actor="t"), "127.0.0.1:8080", actor="t", metrics_url=f"{llamacpp}/lc/metrics")
    for _ in range(3):  # each round is a new Scraper
        module.scrape_round(redis_client)
    assert LlamaCpp.seen.count("/lc/slots") == 1 and LlamaCpp.seen.count("/lc/metrics") == 3


@pytest.mark.django_db(transaction=True)
def test_a_refused_slots_document_is_a_failure_with_its_reason_and_the_counters_are_kept(llamacpp, redis_client):
    from outlier_admin.ingest.models import RejectedInput

    absurd = [{"id": 0, "is_processing": True, "id_task": 1, "n_prompt_tokens_processed": 5,
               "next_token": [{"n_decoded": 10**15}]}]
    cases = {
        "127.0.0.1:1": (orjson.dumps(absurd), "parse", "slots: slot 0: n_decoded"),
        "127.0.0.1:2": (b"[{" * 10, "parse", "slots: not JSON"),
        "127.0.0.1:3": (orjson.dumps([{"id": i, "is_processing": False} for i in range(MAX_SLOTS + 1)]), "parse",
                        f"slots: {MAX_SLOTS + 1} slots"),
        "127.0.0.1:4": (b"[" + b" " * 60_000 + b"]", "too_large", "slots: Content-Length 60002 > 50000 bytes"),
    }
    targets = []
    for i, (node, (body, _kind, _detail)) in enumerate(cases.items()):
        LlamaCpp.pages[f"/n{i}/metrics"] = [fixture("metrics_a.txt")]
        LlamaCpp.pages[f"/n{i}/slots"] = [body]
        targets.append(Target("s", node, f"{llamacpp}/n{i}/metrics"))
    before = {node: failures("s", node, kind) for node, (_b, kind, _d) in cases.items()}
    scraper = Scraper(redis_client, timeout_s=2.0, max_bytes=50_000)
    asyncio.run(scraper.round(targets))
    scraper.keep_rejected()
    for node, (_body, kind, detail) in cases.items():
        assert failures("s", node, kind) - before[node] == 1, node
        assert RejectedInput.objects.get(source=f"metrics:s/{node}").detail.startswith(f"{kind}: {detail}"), node
    assert scraper.stats.scrapes == 4 and redis_client.hlen(keys.itl("s")) == 4  # the counters are kept


@pytest.mark.django_db
def test_a_page_no_engine_wrote_is_unrecognised_and_shown_on_the_nodes_page(llamacpp, redis_client, users):  # noqa: F811
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.ingest.scraper import scrape_round

    LlamaCpp.pages = {"/exporter/metrics": [(FIXTURES / "dcgm" / "datadog-dcgm-metrics.txt").read_bytes()]}
    node = do_register_node(do_create_group("g", actor="t"), "127.0.0.1:9400", actor="t",
                            metrics_url=f"{llamacpp}/exporter/metrics")  # an operator pointed it at DCGM
    before = failures("g", node.name, "unrecognised_engine")
    assert scrape_round(redis_client) == 0 and scrape_round(redis_client) == 0
    assert failures("g", node.name, "unrecognised_engine") - before == 2
    assert redis_client.xlen(keys.stream("g")) == 0 and not redis_client.hexists(keys.itl("g"), node.name)
    c = Client()
    c.force_login(users["viewer"])
    html = c.get(f"/nodes/{node.pk}/").content.decode()
    assert 'id="scrape-failures"' in html and "unrecognised_engine: not a model server page" in html
    assert html.count("unrecognised_engine:") == 1  # kept once a minute, not at every scrape
