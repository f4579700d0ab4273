"""POST /api/v1/ingest/requests: status codes, per-line errors, de-duplication, auto-registration."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from contract import keys
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.models import RejectedInput

pytestmark = [pytest.mark.django_db, pytest.mark.services]
URL = "/api/v1/ingest/requests"


def rec(**kw):
    base = {"ts": time.time(), "node": "127.0.0.1:8000", "group": "llama", "prompt_tokens": 100,
            "completion_tokens": 50, "ttft_ms": 120.0, "total_ms": 900.0, "status": 200}
    return {**base, **kw}


def post(client, token, body, content_type="application/json"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(URL, data=body, content_type=content_type, **headers)


@pytest.fixture(autouse=True)
def llama(make_group):
    return make_group("llama")


def test_json_array_accepts_valid_and_reports_bad_lines(client, ingest_token, redis_client):
    body = orjson.dumps([rec(), rec(total_ms=-1), rec(ts=time.time() + 3600), rec(node="127.0.0.2:8000")])
    resp = post(client, ingest_token, body)
    assert resp.status_code == 200
    data = resp.json()
    assert data["accepted"] == 2 and data["rejected"] == 2
    assert data["errors"] == [{"line": 2, "reason": "bad_total_ms"}, {"line": 3, "reason": "ts_in_future"}]
    assert RejectedInput.objects.filter(reason="ts_in_future", source="http:gw-test").count() == 1
    assert set(Node.objects.values_list("name", flat=True)) == {"127.0.0.1:8000", "127.0.0.2:8000"}
    assert redis_client.xlen(keys.stream("llama")) == 1  # one entry per group per request


def test_ndjson_with_a_broken_line_and_rfc3339(client, ingest_token, redis_client):
    lines = [orjson.dumps(rec(ts="2099-01-01T00:00:00Z")), b"{not json", orjson.dumps(rec(ts=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))]
    resp = post(client, ingest_token, b"\n".join(lines), "application/x-ndjson")
    data = resp.json()
    assert (data["accepted"], data["rejected"]) == (1, 2)
    assert [e["reason"] for e in data["errors"]] == ["ts_in_future", "bad_json"]
    assert RejectedInput.objects.get(reason="bad_json").raw == "{not json"


def test_duplicates_by_request_id_are_counted_once(client, ingest_token, redis_client):
    body = orjson.dumps([rec(request_id="a"), rec(request_id="a"), rec(request_id="b")])
    assert post(client, ingest_token, body).json()["accepted"] == 2
    again = post(client, ingest_token, orjson.dumps([rec(request_id="b"), rec(request_id="c")])).json()
    assert again["accepted"] == 1 and again["duplicates"] == 1


@pytest.mark.parametrize(
    ("token", "content_type", "body", "status"),
    [
        (None, "application/json", b"[]", 401),
        ("oa_wrong", "application/json", b"[]", 401),
        ("ok", "text/csv", b"a,b", 415),
        ("ok", "application/json", b"hello world", 400),
        ("ok", "application/json", b"", 400),
        ("ok", "application/json", b"42", 400),
    ],
)
def test_whole_request_errors(client, ingest_token, redis_client, token, content_type, body, status):
    resp = post(client, ingest_token if token == "ok" else token, body, content_type)
    assert resp.status_code == status
    assert resp.json()["status"] == status and resp.json()["detail"]  # an RFC 9457 problem


def test_body_over_limit_is_413(client, ingest_token, redis_client, settings):
    settings.INGEST_MAX_BODY_BYTES = 2048
    body = orjson.dumps([rec() for _ in range(50)])
    assert post(client, ingest_token, body).status_code == 413


def test_api_token_cannot_ingest(client, redis_client):
    from outlier_admin.control.actions import do_create_token

    _, api = do_create_token(name="ui", scope="api", actor="t")
    assert post(client, api, b"[]").status_code == 401


def test_unknown_node_rejected_when_auto_register_off(client, ingest_token, redis_client, settings):
    settings.AUTO_REGISTER_NODES = False
    data = post(client, ingest_token, orjson.dumps([rec()])).json()
    assert data["errors"] == [{"line": 1, "reason": "unknown_node"}]
    assert not Node.objects.exists()


def test_record_without_group_uses_the_nodes_group(client, ingest_token, redis_client):
    post(client, ingest_token, orjson.dumps([rec()]))
    no_group = rec()
    del no_group["group"]
    assert post(client, ingest_token, orjson.dumps([no_group, rec(node="127.9.9.9:1", group=None)])).json()["errors"] == [
        {"line": 2, "reason": "no_group"}
    ]


def test_records_without_token_counts_are_kept_latency_only(client, ingest_token, redis_client):
    from contract.stream import decode_requests
    from outlier_admin.control.tick import _batch

    no_tokens = rec(total_ms=730.0, ttft_ms=None)
    del no_tokens["prompt_tokens"], no_tokens["completion_tokens"]
    body = orjson.dumps([no_tokens, rec(prompt_tokens=None, completion_tokens=None, total_ms=740.0),
                         rec(completion_tokens=None, total_ms=750.0),  # half a size: latency-only too
                         rec(prompt_tokens=100, completion_tokens=50, cached_tokens=64, total_ms=760.0),
                         rec(cached_tokens=101)])  # more cached than prompt: refused
    data = post(client, ingest_token, body).json()
    assert (data["accepted"], data["errors"]) == (4, [{"line": 5, "reason": "bad_cached_tokens"}])
    rows = [row for _, fields in redis_client.xrange(keys.stream("llama")) for row in decode_requests(fields)]
    assert [(r[2], r[3], r[5]) for r in rows] == [(None, None, 730.0), (None, None, 740.0), (None, None, 750.0),
                                                  (100, 50, 760.0)]
    batch = _batch(rows)  # the tick: null -> NaN, latency-only rows kept
    assert np.isnan(batch.prompt_tokens[:3]).all() and batch.prompt_tokens[3] == 100.0 and len(batch) == 4


def test_cached_tokens_and_queue_time_reach_the_detector_and_older_rows_still_read(client, ingest_token,
                                                                                  redis_client):
    from contract.stream import decode_requests
    from outlier_admin.control.tick import _batch

    body = orjson.dumps([rec(prompt_tokens=1000, completion_tokens=50, cached_tokens=800, ttft_ms=300.0,
                             queue_ms=120.0, total_ms=900.0),
                         rec(ttft_ms=300.0, queue_ms=301.0, total_ms=900.0)])  # more queue than TTFT: refused
    data = post(client, ingest_token, body).json()
    assert (data["accepted"], data["errors"]) == (1, [{"line": 2, "reason": "bad_queue_ms"}])
    rows = [row for _, fields in redis_client.xrange(keys.stream("llama")) for row in decode_requests(fields)]
    assert rows[0][7:] == [800, 120.0]
    # A row of 7 written before the last two columns, next to a new one, in one tick's batch.
    batch = _batch([rows[0][:7], rows[0]])
    assert np.isnan(batch.cached_tokens[0]) and batch.cached_tokens[1] == 800.0
    assert batch.queue_ms[1] == 120.0 and batch.computed_prompt()[1] == 200.0
