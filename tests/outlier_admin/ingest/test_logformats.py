"""Log parsers on the real third-party samples in tests/fixtures/gateway-logs."""

from __future__ import annotations

import pytest

from outlier_admin.ingest.logformats import FORMATS, ParseError
from outlier_admin.ingest.logformats import nginx as nginx_fmt
from tests.conftest import FIXTURES

LOGS = FIXTURES / "gateway-logs"


def test_envoy_ai_gateway_llm_line_has_tokens_and_end_time():
    line = (LOGS / "envoy-ai-gateway-accesslog.jsonl").read_text().splitlines()[0]
    rec = FORMATS["envoy"](line, node_map={"34.128.142.77:443": "gpu-a"})
    # start_time 2025-08-30T16:51:37.894Z + duration 1526 ms
    assert rec["ts"] == pytest.approx(1756572697.894 + 1.526)
    assert (rec["node"], rec["prompt_tokens"], rec["completion_tokens"]) == ("gpu-a", 15, 7)
    assert (rec["total_ms"], rec["status"], rec["ttft_ms"]) == (1526.0, 200, None)
    assert rec["request_id"] == "83b63da3-45a9-4196-98b8-1a7f697d6d8d"


def test_envoy_pretty_printed_doc_sample_parses_as_one_object():
    rec = FORMATS["envoy"]((LOGS / "envoy-ai-gateway-llm-accesslog.json").read_text())
    assert rec["node"] == "34.128.142.77:443"


def test_envoy_mcp_line_without_tokens_is_refused():
    line = (LOGS / "envoy-ai-gateway-accesslog.jsonl").read_text().splitlines()[1]
    with pytest.raises(ParseError) as err:
        FORMATS["envoy"](line)
    assert err.value.reason == "no_token_counts"


def test_envoy_default_text_format_is_not_json():
    with pytest.raises(ParseError) as err:
        FORMATS["envoy"]((LOGS / "envoy-default-format-example.log").read_text())
    assert err.value.reason == "bad_json"


def test_nginx_fields_of_every_fixture_line():
    lines = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()
    fields = [nginx_fmt.parse_fields(line) for line in lines]
    assert len(fields) == 29
    assert fields[0]["upstream_addr"] == ["127.17.0.5:8080"] and fields[0]["request_time"] == "0.001"
    retry = fields[22]
    assert retry["upstream_addr"] == ["127.17.0.6:8080", "127.17.0.7:8080"]
    assert retry["upstream_response_time"] == ["0.100", "0.004"] and retry["upstream_status"] == ["200", "203"]


def _with_tokens(line: str) -> str:
    return line + " prompt_tokens=120 completion_tokens=30"


def test_nginx_retry_line_describes_the_last_upstream():
    line = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()[22]
    rec = FORMATS["nginx"](_with_tokens(line))
    assert rec["node"] == "127.17.0.7:8080" and rec["total_ms"] == pytest.approx(4.0) and rec["status"] == 203
    assert rec["ts"] == pytest.approx(1581076962.0)  # 07/Feb/2020:12:02:42 +0000


@pytest.mark.parametrize(
    ("index", "reason"),
    [(4, "no_upstream"), (26, "bad_upstream_addr"), (0, "no_token_counts")],
)
def test_nginx_refusals(index, reason):
    line = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()[index]
    with pytest.raises(ParseError) as err:
        FORMATS["nginx"](line if reason == "no_token_counts" else _with_tokens(line))
    assert err.value.reason == reason


def test_nginx_ipv6_and_unix_socket_upstreams():
    lines = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()
    assert FORMATS["nginx"](_with_tokens(lines[24]))["node"] == "[2a02:cf40::]:9200"
    assert FORMATS["nginx"](_with_tokens(lines[27]))["node"] == "unix:/var/run/php-fpm.sock"


def test_jsonl_maps_node_and_refuses_non_objects():
    assert FORMATS["jsonl"]('{"node": "a:1", "ts": 1}', node_map={"a:1": "n1"})["node"] == "n1"
    with pytest.raises(ParseError):
        FORMATS["jsonl"]("[1, 2]")
