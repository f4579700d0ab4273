"""Issue 36, finding 3: one ingest token cannot take the workers, and a garbage line costs less than a
valid one. (Ingest's own process group and the flood's effect on the viewer's P99 through the real
nginx and gunicorn: ``bench/ingest_flood.py``; the proxy's routing: ``test_proxy_budgets.py``.)"""

from __future__ import annotations

import time

import orjson
import pytest
from django.test import Client

from contract import keys
from outlier_admin.control import buckets
from outlier_admin.fleet.models import ApiToken
from outlier_admin.observability import metrics

pytestmark = [pytest.mark.django_db, pytest.mark.services]
URL = "/api/v1/ingest/requests"


def rec(**kw):
    return {"ts": time.time(), "node": "127.0.0.1:8000", "group": "g1", "prompt_tokens": 100,
            "completion_tokens": 20, "ttft_ms": 100.0, "total_ms": 900.0, "status": 200, **kw}


def post(token: str, body: bytes):
    return Client().post(URL, data=body, content_type="application/x-ndjson", HTTP_AUTHORIZATION=f"Bearer {token}")


def throttled(limit: str) -> float:
    return metrics.EVENTS.get_sample_value("outlier_ingest_throttled_total", {"token": "gw-test", "limit": limit}) or 0


def test_a_token_over_its_requests_in_progress_gets_429_with_retry_after_counted(
        ingest_token, redis_client, make_group, settings):
    make_group("g1")
    settings.INGEST_TOKEN_CONCURRENCY = 2
    token = ApiToken.objects.get(name="gw-test")
    key = keys.ingest_inflight(token.pk)
    held = [buckets.hold(key, limit=2, ttl_s=60) for _ in range(2)]  # two batches of this token in progress
    before = throttled("concurrency")
    resp = post(ingest_token, orjson.dumps(rec()))
    assert resp.status_code == 429 and resp["Retry-After"] == "1", resp.content
    problem = resp.json()
    assert problem["limit"] == "concurrency" and "INGEST_TOKEN_CONCURRENCY" in problem["detail"]
    assert throttled("concurrency") == before + 1
    # Another token is not held back by this one's flood.
    from outlier_admin.control.actions import do_create_token

    _, other = do_create_token(name="gw-other", scope="ingest", actor="test")
    assert post(other, orjson.dumps(rec())).json()["accepted"] == 1
    buckets.release(key, held[0])
    assert post(ingest_token, orjson.dumps(rec())).json()["accepted"] == 1
    assert redis_client.zcard(key) == 1, "the request gave its slot back"


def test_a_token_over_its_byte_rate_gets_429_with_the_refill_time(ingest_token, redis_client, make_group, settings):
    make_group("g1")
    body = b"\n".join(orjson.dumps(rec(request_id=f"r{i}")) for i in range(10))  # ~1.7 kB
    settings.INGEST_TOKEN_BYTES_PER_S = 1000
    settings.INGEST_TOKEN_BURST_BYTES = len(body) + 200
    before = throttled("bytes")
    assert post(ingest_token, body).json()["accepted"] == 10
    resp = post(ingest_token, body)
    assert resp.status_code == 429 and resp.json()["limit"] == "bytes"
    assert 1 <= int(resp["Retry-After"]) <= 2  # 0.2 kB left, ~1.7 kB needed, 1 kB/s
    assert throttled("bytes") == before + 1
    time.sleep(int(resp["Retry-After"]))
    assert post(ingest_token, body).json()["duplicates"] == 10, "the refused body was not applied; now it is"


def test_garbage_lines_never_reach_the_per_record_checks_or_a_second_json_parse(
        ingest_token, redis_client, make_group, monkeypatch):
    """The flood of the finding: 100k lines that are not records. Before, each was parsed twice (orjson,
    then the standard library) or went through ``normalize`` and an exception: 2-3x the CPU of a
    valid line (the figures: bench/ingest_flood.py --cpu)."""
    import json
    from types import SimpleNamespace

    from outlier_admin.ingest import columns, views

    make_group("g1")
    calls = {"normalize": 0, "stdlib": 0}
    real_one, real_loads = columns._one, json.loads

    def counting_one(*args, **kwargs):
        calls["normalize"] += 1
        return real_one(*args, **kwargs)

    def counting_loads(*args, **kwargs):
        calls["stdlib"] += 1
        return real_loads(*args, **kwargs)

    monkeypatch.setattr(columns, "_one", counting_one)
    monkeypatch.setattr(views, "json", SimpleNamespace(loads=counting_loads))
    body = orjson.dumps(rec()) + b"\n" + b"x\n" * 3000 + b"1\n" * 3000 + b'{"a": 1}\n' * 3000 + b'{"ts": 1}\n' * 3000
    out = post(ingest_token, body).json()
    assert out["accepted"] == 1 and out["rejected"] == 12_000
    assert out["errors"][:4] == [{"line": 2, "reason": "bad_json"}, {"line": 3, "reason": "bad_json"},
                                 {"line": 4, "reason": "bad_json"}, {"line": 5, "reason": "bad_json"}]
    assert calls == {"normalize": 0, "stdlib": 0}
    # What only the standard library reads is still read by it: one record refused, not the body.
    out = post(ingest_token, orjson.dumps(rec()) + b'\n{"ts": 1, "node": "127.0.0.1:8000", "total_ms": 1e400}\n').json()
    assert out["accepted"] == 1 and out["rejected"] == 1 and calls["stdlib"] == 1
