"""Log parsers on the real samples in tests/fixtures/gateway-logs (third-party, and recorded from a
real nginx 1.22 and HAProxy 2.6 writing their default formats)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from contract.logformats import FORMATS, ParseError
from contract.logformats import nginx as nginx_fmt
from contract.logformats.auto import sniff
from contract.normalize import RecordError, normalize
from tests.conftest import FIXTURES

LOGS = FIXTURES / "gateway-logs"
BOUNDS = {"max_future_s": 300, "retention_s": 10**10, "max_latency_ms": 3_600_000,
          "max_prompt_tokens": 10_000_000, "max_completion_tokens": 1_000_000}


def lines_of(name: str) -> list[str]:
    return [x for x in (LOGS / name).read_text().splitlines() if x.strip()]


def reason_of(fmt: str, line: str, **kw) -> ParseError:
    with pytest.raises(ParseError) as err:
        FORMATS[fmt](line, **kw)
    return err.value


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


def test_envoy_mcp_line_without_tokens_is_a_latency_only_record():
    line = (LOGS / "envoy-ai-gateway-accesslog.jsonl").read_text().splitlines()[1]
    rec = FORMATS["envoy"](line)
    assert rec["prompt_tokens"] is None and rec["completion_tokens"] is None and rec["total_ms"] > 0
    out = normalize(rec, now=rec["ts"], **BOUNDS)
    assert (out["prompt_tokens"], out["completion_tokens"]) == (None, None)


def test_envoy_default_text_format():
    # [2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 ... "tcp://127.0.2.1:80"
    rec = FORMATS["envoy"]((LOGS / "envoy-default-format-example.log").read_text())
    assert (rec["node"], rec["status"], rec["total_ms"], rec["ttft_ms"]) == ("127.0.2.1:80", 204, 226.0, None)
    assert rec["ts"] == pytest.approx(datetime(2016, 4, 15, 20, 17, 0, 310000, tzinfo=UTC).timestamp() + 0.226)
    assert rec["request_id"] == "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2"
    assert rec["prompt_tokens"] is None and FORMATS["auto"]((LOGS / "envoy-default-format-example.log").read_text())


def test_envoy_text_line_without_upstream_names_envoy():
    line = (LOGS / "envoy-default-format-example.log").read_text().replace('"tcp://127.0.2.1:80"', '"-"')
    err = reason_of("auto", line)
    assert (err.reason, err.fmt) == ("no_upstream", "envoy")


def test_envoy_json_with_a_nested_openai_usage():
    line = orjson.dumps({"start_time": "2026-12-03T07:35:32.000Z", "duration": 900, "upstream_host": "127.0.0.1:8000",
                         "response_code": 200, "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                                                         "prompt_tokens_details": {"cached_tokens": 64}}}).decode()
    rec = FORMATS["envoy"](line)
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["cached_tokens"]) == (100, 20, 64)


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


@pytest.mark.parametrize(("index", "reason"), [(4, "no_upstream"), (26, "bad_upstream_addr")])
def test_nginx_refusals(index, reason):
    line = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()[index]
    err = reason_of("nginx", _with_tokens(line))
    assert (err.reason, err.fmt) == (reason, "nginx")


def test_nginx_ingress_line_without_tokens_is_latency_only():
    line = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()[0]
    rec = FORMATS["nginx"](line)
    # $upstream_response_time 0.000: the upstream's own time, not $request_time (0.001)
    assert rec["node"] == "127.17.0.5:8080" and rec["prompt_tokens"] is None and rec["total_ms"] == 0.0


def test_nginx_ipv6_and_unix_socket_upstreams():
    lines = (LOGS / "beats-nginx-ingress-controller-test.log").read_text().splitlines()
    assert FORMATS["nginx"](_with_tokens(lines[24]))["node"] == "[2a02:cf40::]:9200"
    assert FORMATS["nginx"](_with_tokens(lines[27]))["node"] == "unix:/var/run/php-fpm.sock"


def test_jsonl_maps_node_and_refuses_non_objects():
    assert FORMATS["jsonl"]('{"node": "a:1", "ts": 1}', node_map={"a:1": "n1"})["node"] == "n1"
    with pytest.raises(ParseError):
        FORMATS["jsonl"]("[1, 2]")


# --- nginx combined, as a real nginx 1.22 writes it ---------------------------------------------------


def test_real_nginx_combined_plus_upstream_fields():
    for line in lines_of("nginx-1.22-upstream.log"):
        fields = line.split()
        rec = FORMATS["auto"](line)
        assert rec["_format"] == "nginx"
        assert rec["node"] == fields[-2] and rec["total_ms"] == pytest.approx(float(fields[-1]) * 1000)
        assert (rec["prompt_tokens"], rec["status"], rec["request_id"]) == (None, 200, None)
        assert rec["ts"] == datetime.strptime(line.split("[")[1].split("]")[0], "%d/%b/%Y:%H:%M:%S %z").timestamp()


def test_real_nginx_combined_plus_times_needs_a_node_for_lines_that_name_none():
    lines = lines_of("nginx-1.22-timed.log")
    err = reason_of("auto", lines[0])
    assert (err.reason, err.fmt) == ("no_upstream", "nginx") and "--node-map" in err.detail
    for line in lines:
        rec = FORMATS["nginx"](line, node_map={"*": "127.0.0.9:8000"})
        # $request_time $upstream_response_time: the upstream's own time is the node's latency.
        assert rec["node"] == "127.0.0.9:8000" and rec["total_ms"] == pytest.approx(float(line.split()[-1]) * 1000)


def test_real_nginx_plain_combined_is_refused_naming_what_to_append():
    line = lines_of("nginx-1.22-combined.log")[0]
    assert reason_of("auto", line).reason == "no_upstream"
    err = reason_of("auto", line, node_map={"*": "127.0.0.9:8000"})
    assert (err.reason, err.fmt) == ("no_latency", "nginx") and "$request_time" in err.detail


@pytest.mark.parametrize(("suffix", "node", "total_ms"), [
    (" 0.300 127.0.0.1:8001, 127.0.0.1:8002 0.100, 0.190", "127.0.0.1:8002", 190.0),  # a retry
    (" 0.300 127.0.0.1:8001 : 127.0.0.1:8002 0.100 : 0.190", "127.0.0.1:8002", 190.0),  # upstream groups
    (" 0.300 - -", "127.0.0.9:8000", 300.0),  # no upstream: the source's node, nginx's time
    (" 0.300", "127.0.0.9:8000", 300.0),
    (' rt=0.300 ua="127.0.0.1:8003" urt="0.250" prompt_tokens=12 completion_tokens=30', "127.0.0.1:8003", 250.0),
])
def test_nginx_combined_suffixes(suffix, node, total_ms):
    base = '127.0.0.1 - - [03/Dec/2026:07:35:32 +0000] "POST /v1/completions HTTP/1.1" 200 180 "-" "curl/8.0"'
    rec = FORMATS["nginx"](base + suffix, node_map={"*": "127.0.0.9:8000"})
    assert (rec["node"], rec["total_ms"]) == (node, pytest.approx(total_ms))


# --- HAProxy's default httplog, as a real HAProxy 2.6 writes it ---------------------------------------


def test_real_haproxy_default_httplog_is_latency_only_and_keyed_by_the_mapped_address():
    lines = lines_of("haproxy-2.6-httplog-default.log")
    node_map = {"llm/s0": "127.0.0.1:9000", "llm/s1": "127.0.0.1:9001"}
    recs = [FORMATS["auto"](line, node_map=node_map) for line in lines]
    assert {r["_format"] for r in recs} == {"haproxy"} and len(recs) == 6
    assert [r["node"] for r in recs] == ["127.0.0.1:9000", "127.0.0.1:9001"] * 3  # round-robin
    assert all(r["prompt_tokens"] is None and r["total_ms"] > 0 for r in recs)
    assert FORMATS["haproxy"](lines[0])["node"] == "s0"  # unmapped: the server name as logged


# --- LiteLLM and OpenAI-style JSON --------------------------------------------------------------------


def test_litellm_standard_logging_payload():
    payload = orjson.loads((LOGS / "litellm-standard-logging-payload.json").read_bytes())
    rec = FORMATS["auto"](orjson.dumps(payload).decode())
    assert rec["_format"] == "litellm"
    start = datetime(2025, 1, 24, 9, 20, 46, 847371, tzinfo=UTC).timestamp()
    end = datetime(2025, 1, 24, 9, 20, 46, 851954, tzinfo=UTC).timestamp()
    assert rec["node"] == "127.0.0.1:4000"  # hidden_params.api_base; the top-level one is empty
    assert (rec["ts"], rec["total_ms"]) == (pytest.approx(end), pytest.approx((end - start) * 1000))
    assert rec["ttft_ms"] == pytest.approx((end - start) * 1000)  # streamed, first chunk at the end
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["status"]) == (10, 20, 200)
    assert rec["group"] is None and rec["request_id"] == "chatcmpl-2299b6a2-82a3-465a-b47c-04e685a2227f"
    wrapped = FORMATS["litellm"](orjson.dumps({"standard_logging_object": payload}).decode())
    assert wrapped["node"] == rec["node"]


@pytest.mark.parametrize(("error", "status"), [
    ({"error_code": "429", "error_class": "RateLimitError"}, 429),
    ({"error_code": "", "error_class": "Timeout"}, 504),
    ({"error_code": "", "error_class": "APIConnectionError"}, 500),
])
def test_litellm_failure_is_an_error_sample_without_sizes(error, status):
    payload = orjson.loads((LOGS / "litellm-standard-logging-payload.json").read_bytes())
    payload.update(status="failure", prompt_tokens=0, completion_tokens=0, model_group="llama3-70b/h800",
                   api_base="http://127.0.0.3:8000/v1", error_information=error)
    rec = FORMATS["litellm"](orjson.dumps(payload).decode())
    assert (rec["status"], rec["prompt_tokens"], rec["node"]) == (status, None, "127.0.0.3:8000")
    assert rec["group"] == "llama3-70b/h800"


def test_openai_style_json_with_nested_usage_and_cached_tokens():
    recs = [FORMATS["auto"](line) for line in lines_of("openai-usage-accesslog.jsonl")]
    assert [r["_format"] for r in recs] == ["openai"] * 3
    out = [normalize(r, now=1796283334.0, **BOUNDS) for r in recs]
    assert [(o["node"], o["prompt_tokens"], o["completion_tokens"], o["cached_tokens"], o["total_ms"]) for o in out] == [
        ("127.0.0.1:8000", 2006, 300, 1920, 812.4),
        ("127.0.0.2:8000", 328, 52, 0, pytest.approx(1204.0)),
        ("127.0.0.1:8000", None, None, None, 30012.0),
    ]
    assert out[2]["status"] == 504 and out[0]["request_id"] == "req-1" and out[1]["request_id"] == "resp_2"


# --- auto and the reasons that name a format ----------------------------------------------------------


@pytest.mark.parametrize(("name", "fmt"), [
    ("nginx-1.22-combined.log", "nginx"), ("nginx-1.22-timed.log", "nginx"), ("nginx-1.22-upstream.log", "nginx"),
    ("beats-nginx-ingress-controller-test.log", "nginx"), ("haproxy-2.6-httplog-default.log", "haproxy"),
    ("envoy-default-format-example.log", "envoy"), ("envoy-ai-gateway-accesslog.jsonl", "envoy"),
    ("openai-usage-accesslog.jsonl", "openai"),
])
def test_auto_recognises_every_real_line(name, fmt):
    lines = lines_of(name)
    if name.startswith("beats"):
        lines = [x for i, x in enumerate(lines) if i not in (9, 10, 11)]  # its deliberately malformed lines
    assert {sniff(line) for line in lines} == {fmt}


def test_a_line_of_another_format_is_refused_naming_it():
    nginx_line = lines_of("nginx-1.22-upstream.log")[0]
    haproxy_line = lines_of("haproxy-2.6-httplog-default.log")[0]
    envoy_text = (LOGS / "envoy-default-format-example.log").read_text()
    for fmt, line, looks_like in [("envoy", nginx_line, "nginx"), ("nginx", haproxy_line, "haproxy"),
                                  ("haproxy", envoy_text, "envoy"), ("jsonl", envoy_text, "envoy"),
                                  ("litellm", lines_of("openai-usage-accesslog.jsonl")[0], "openai"),
                                  ("envoy", (LOGS / "litellm-standard-logging-payload.json").read_text(), "litellm"),
                                  ("envoy", lines_of("openai-usage-accesslog.jsonl")[1], "openai")]:
        err = reason_of(fmt, line)
        assert (err.reason, err.fmt) == ("wrong_format", looks_like), fmt
        assert f"--format {looks_like}" in err.detail


def test_auto_refuses_what_it_cannot_recognise():
    for line in ("hello world", '{"a": 1}', "[1, 2]"):
        assert reason_of("auto", line).reason == "unrecognized_format"
    assert reason_of("auto", "{broken").reason == "bad_json"


# --- latency-only records and cached tokens in normalize ----------------------------------------------


def _rec(**kw):
    return {"ts": 1000.0, "node": "127.0.0.1:8000", "total_ms": 250.0, **kw}


@pytest.mark.parametrize(("given", "expected"), [
    ({}, (None, None, None)),
    ({"prompt_tokens": 12}, (None, None, None)),  # half a size is no size
    ({"prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 8}, (12, 3, 8)),
    ({"prompt_tokens": 12, "completion_tokens": 3}, (12, 3, None)),
])
def test_token_counts_are_both_or_none(given, expected):
    out = normalize(_rec(**given), now=1000.0, **BOUNDS)
    assert (out["prompt_tokens"], out["completion_tokens"], out["cached_tokens"]) == expected


@pytest.mark.parametrize(("given", "reason"), [
    ({"prompt_tokens": 1e20}, "bad_prompt_tokens"),  # refused even without its partner
    ({"completion_tokens": "many"}, "bad_completion_tokens"),
    ({"prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 13}, "bad_cached_tokens"),
    ({"prompt_tokens": 0, "completion_tokens": 0}, "no_tokens"),
])
def test_bad_token_counts_are_refused(given, reason):
    with pytest.raises(RecordError) as err:
        normalize(_rec(**given), now=1000.0, **BOUNDS)
    assert err.value.reason == reason


def test_node_map_option():
    from contract.logformats import parse_node_map

    assert parse_node_map("llm/s0=127.0.0.1:9000, *=127.0.0.2:9000") == {"llm/s0": "127.0.0.1:9000",
                                                                        "*": "127.0.0.2:9000"}
    assert parse_node_map('{"llm/s1": "127.0.0.1:9001"}') == {"llm/s1": "127.0.0.1:9001"}
    for bad in ("llm/s0", "llm/s0=http://127.0.0.1:9000/v1", '{"a": 1}', "[1]", "=127.0.0.1:1"):
        with pytest.raises(ValueError):
            parse_node_map(bad)
