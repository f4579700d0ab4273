"""The fake inference server's HTTP contract (harness.gateways.FakeInferenceServer), what the gateway and
router tests rely on: completions and chat answers with their usage and headers, the timing modes,
the routes routers probe, the admin endpoints and the counters."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.gateways import FAKE_MODEL, FakeInferenceServer


@pytest.fixture
def fake() -> Iterator[FakeInferenceServer]:
    srv = FakeInferenceServer("f0", base_delay_s=0.001, completion_tokens=4)
    yield srv
    srv.stop()


def _call(srv: FakeInferenceServer, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _post(srv: FakeInferenceServer, path: str, payload: Any, **headers: str) -> tuple[int, dict[str, str], Any]:
    status, hdrs, body = _call(srv, "POST", path, json.dumps(payload).encode(),
                               {"Content-Type": "application/json", **headers})
    return status, hdrs, json.loads(body) if status == 200 else body


def test_a_completion_answers_with_usage_and_the_server_name(fake) -> None:
    status, hdrs, answer = _post(fake, "/v1/completions", {"prompt": "one two three", "max_tokens": 50})
    assert status == 200
    assert answer["id"] == "cmpl-f0-1" and answer["object"] == "text_completion" and answer["model"] == FAKE_MODEL
    # Fixed mode: the configured completion tokens, whatever max_tokens asks.
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert answer["choices"][0]["text"] == " ok" * 4
    assert hdrs["x-served-by"] == "f0"
    assert (hdrs["x-prompt-tokens"], hdrs["x-completion-tokens"]) == ("3", "4")
    assert "x-ttft-ms" not in hdrs


def test_a_chat_completion_counts_the_words_of_its_messages(fake) -> None:
    payload = {"messages": [{"role": "user", "content": "a b"}, {"role": "user", "content": "c"}, "junk"]}
    status, _, answer = _post(fake, "/v1/chat/completions", payload)
    assert status == 200
    assert answer["id"] == "chatcmpl-f0-1" and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": " ok" * 4}
    assert answer["usage"]["prompt_tokens"] == 3


def test_a_body_that_is_not_a_request_still_gets_an_answer(fake) -> None:
    for body in (b"not json", b"[1, 2]", b'{"max_tokens": "many"}'):
        status, _, raw = _call(fake, "POST", "/v1/completions", body)
        assert status == 200
        assert json.loads(raw)["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    status, _, raw = _call(fake, "POST", "/v1/chat/completions", b"[1]")
    assert status == 200 and json.loads(raw)["usage"]["prompt_tokens"] == 1


def test_per_token_mode_honours_max_tokens_and_reports_the_ttft() -> None:
    srv = FakeInferenceServer("p0", per_token_ms=0.5, ttft_ms=2.0, prefill_ms_per_token=0.1)
    try:
        status, hdrs, answer = _post(srv, "/v1/completions", {"prompt": "x " * 10, "max_tokens": 6})
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 6
        assert float(hdrs["x-ttft-ms"]) >= 3.0  # ttft_ms + 10 prompt tokens x 0.1 ms
    finally:
        srv.stop()


@pytest.mark.parametrize("route", ["/health", "/v1/models", "/get_model_info", "/server_info", "/version"])
def test_the_routes_routers_probe_answer_at_once_and_are_not_completions(fake, route) -> None:
    status, hdrs, raw = _call(fake, "GET", route, headers={"User-Agent": "router/1.0"})
    assert status == 200 and hdrs["content-type"] == "application/json"
    body = json.loads(raw)
    if route == "/v1/models":
        assert body["data"][0]["id"] == FAKE_MODEL
    if route == "/server_info":
        assert body["name"] == "f0"
    stats = fake.stats()
    assert stats["requests"] == 0
    assert stats["paths"] == {route: 1} and stats["user_agents"] == {"router": 1}


def test_an_unknown_route_is_404(fake) -> None:
    status, _, _ = _call(fake, "POST", "/v2/unknown", b"{}")
    assert status == 404
    assert fake.stats()["requests"] == 0


def test_admin_sets_the_slowdown_and_reports_the_counters(fake) -> None:
    _post(fake, "/v1/completions", {"prompt": "hi"}, **{"User-Agent": "python-httpx/0.27"})
    status, _, stats = _post(fake, "/admin/slowdown", {"slowdown": 2.5})
    assert status == 200
    assert stats == {"name": "f0", "slowdown": 2.5, "requests": 1, "paths": {"/v1/completions": 1},
                     "user_agents": {"python-httpx": 1}}
    assert fake.delay_s == pytest.approx(0.0025)
    status, _, raw = _call(fake, "GET", "/admin/stats")
    assert status == 200 and json.loads(raw)["slowdown"] == 2.5
    assert _call(fake, "POST", "/admin/slowdown", b'{"speed": 1}')[0] == 400
    assert _call(fake, "GET", "/admin/other")[0] == 404
    fake.heal()
    assert fake.stats()["slowdown"] == 1.0
