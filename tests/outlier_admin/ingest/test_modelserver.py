"""Model-server /metrics scrapes -> streamed decode progress -> the tick's detector (real Redis and
PostgreSQL, a real local HTTP server standing in for vLLM)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest

from contract import keys
from detector.engine_metrics import parse
from harness.records import http_server
from outlier_admin.ingest.modelserver import record_scrape
from outlier_admin.ingest.scraper import scrape_round
from tests.conftest import FIXTURES

VLLM = (FIXTURES / "vllm" / "datadog-vllm_metrics.txt").read_text()
SGLANG = (FIXTURES / "vllm" / "datadog-sglang_metrics.txt").read_text()


def itl_text(sum_s: float, count: float, name: str = "vllm:inter_token_latency_seconds") -> str:
    return (f"# TYPE {name} histogram\n"
            f'{name}_bucket{{le="+Inf",model_name="m"}} {count}\n'
            f'{name}_count{{model_name="m"}} {count}\n'
            f'{name}_sum{{model_name="m"}} {sum_s}\n')


def test_a_real_vllm_and_sglang_capture_read_through_the_detectors_parser():
    # The parser and the row arithmetic are tested in tests/detector/test_engine_metrics.py; here, the
    # captures the scraper meets. The vLLM one holds V0's time_per_output_token and V1's inter-token
    # histogram: V1's is read.
    v, s = parse(VLLM), parse(SGLANG)
    assert (v.itl_sum_s, v.itl_count) == (0.6237391703762114, 144.0)
    assert (v.prefill_sum_s, v.prefill_count, v.computed_sum) == (0.2140041133388877, 6.0, 53.0)
    assert (s.itl_sum_s, s.itl_count) == (0.05, 31.0)
    assert parse("# TYPE up gauge\nup 1\n") is None


class Metrics(BaseHTTPRequestHandler):
    text = ""

    def do_GET(self):
        body = Metrics.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    with http_server(Metrics) as url:
        yield f"{url}/metrics"


@pytest.mark.django_db
def test_scrapes_reach_the_detector_as_decode_samples(metrics_server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.control.tick import _load_detector, run_tick
    from outlier_admin.fleet.models import ModelGroup

    group = do_create_group("g", actor="t")
    do_register_node(group, "127.0.0.1:8000", actor="t", metrics_url=metrics_server)
    do_register_node(group, "127.0.0.2:8000", actor="t")  # no metrics_url: not scraped
    Metrics.text = itl_text(10.0, 1000)
    assert scrape_round() == 0  # the first scrape only sets the base
    Metrics.text = itl_text(10.7, 1050)  # 50 tokens at 14 ms
    assert scrape_round() == 1
    res = run_tick("g")
    assert res.progress == 1
    gd, _, _ = _load_detector(redis_client, ModelGroup.objects.get(name="g"), res.at)
    i = gd.index_of("127.0.0.1:8000")
    assert gd.ewma["decode"].count[i] == 1 and gd.ewma["decode"].mean[i] == pytest.approx(14.0)


@pytest.mark.django_db
def test_a_bad_scrape_is_kept_with_its_reason(metrics_server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.ingest.models import RejectedInput

    group = do_create_group("g", actor="t")
    node = do_register_node(group, "127.0.0.1:8000", actor="t", metrics_url=metrics_server)
    Metrics.text = "# TYPE up gauge\nup 1\n"  # a /metrics without the histogram (not a model server?)
    assert scrape_round() == 0
    bad = RejectedInput.objects.get()
    assert bad.reason == "scrape_failed" and "inter-token" in bad.detail and bad.source == f"metrics:{node}"
    node.metrics_url = "http://127.0.0.1:9/metrics"  # nothing listens there
    node.save()
    assert scrape_round() == 0 and RejectedInput.objects.count() == 2


@pytest.mark.django_db
def test_record_scrape_rebases_after_a_restart(redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node

    node = do_register_node(do_create_group("g", actor="t"), "127.0.0.1:8000", actor="t")
    assert record_scrape(redis_client, node, itl_text(50.0, 5000), 100.0) is None
    assert record_scrape(redis_client, node, itl_text(0.1, 10), 101.0) is None  # restarted
    row = record_scrape(redis_client, node, itl_text(0.8, 60), 102.0)
    # Decode columns only: the page has no prefill, prompt or running series.
    assert row == ["127.0.0.1:8000", 102.0, 1.0, 50, pytest.approx(700.0), None, None, None, None, None, None, None]
    assert redis_client.xlen(keys.stream("g")) == 1


@pytest.mark.django_db
def test_a_node_that_streamed_nothing_queues_no_row(metrics_server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node

    do_register_node(do_create_group("g", actor="t"), "127.0.0.1:8000", actor="t", metrics_url=metrics_server)
    Metrics.text = itl_text(10.0, 1000)
    scrape_round()
    assert scrape_round() == 0  # same counters: an idle node
    assert redis_client.xlen(keys.stream("g")) == 0
