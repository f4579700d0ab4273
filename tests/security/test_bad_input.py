"""Bad input at the edges: oversized bodies 413, wrong content type 415, unknown nodes registered or
rejected per ``AUTO_REGISTER_NODES``, timestamps far in the future/past rejected and kept, invalid
thresholds 400 naming the field and its range (nothing stored)."""

from __future__ import annotations

import time

import orjson
import pytest

from outlier_admin.fleet.models import Node
from outlier_admin.ingest.models import RejectedInput

pytestmark = [pytest.mark.django_db, pytest.mark.services]
URL = "/api/v1/ingest/requests"


@pytest.fixture(autouse=True)
def g1(make_group):
    return make_group("g1")


def _rec(**kw):
    return {"ts": time.time(), "node": "127.0.0.1:8000", "group": "g1", "prompt_tokens": 100,
            "completion_tokens": 20, "total_ms": 900.0, "status": 200, **kw}


def _post(client, token, body: bytes, ctype="application/json"):
    return client.post(URL, data=body, content_type=ctype, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_oversized_body_is_413_and_nothing_is_stored(client, ingest_token, redis_client, settings):
    settings.INGEST_MAX_BODY_BYTES = 2048
    body = orjson.dumps([_rec() for _ in range(40)])
    assert len(body) > 2048
    resp = _post(client, ingest_token, body)
    assert resp.status_code == 413 and "limit" in resp.json()["detail"]
    assert not Node.objects.exists() and redis_client.dbsize() == 0


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "application/xml"])
def test_wrong_content_type_is_415(client, ingest_token, redis_client, ctype):
    resp = _post(client, ingest_token, orjson.dumps([_rec()]), ctype)
    assert resp.status_code == 415 and ctype in resp.json()["detail"]


def test_unknown_node_rejected_with_reason_when_auto_registration_is_off(client, ingest_token, redis_client,
                                                                         settings):
    assert _post(client, ingest_token, orjson.dumps([_rec()])).json()["accepted"] == 1  # registers it
    settings.AUTO_REGISTER_NODES = False
    out = _post(client, ingest_token, orjson.dumps([_rec(), _rec(node="127.9.9.9:8000")])).json()
    assert (out["accepted"], out["rejected"]) == (1, 1)
    assert out["errors"] == [{"line": 2, "reason": "unknown_node"}]
    kept = RejectedInput.objects.get(reason="unknown_node")
    assert "127.9.9.9:8000" in kept.raw
    assert not Node.objects.filter(address="127.9.9.9:8000").exists()


def test_far_future_and_far_past_timestamps_are_rejected_and_kept(client, ingest_token, redis_client, settings):
    now = time.time()
    body = [_rec(ts=now + settings.INGEST_MAX_FUTURE_S + 3600), _rec(ts=now - settings.INGEST_RETENTION_S - 3600),
            _rec(ts=now)]
    out = _post(client, ingest_token, orjson.dumps(body)).json()
    assert (out["accepted"], out["rejected"]) == (1, 2)
    assert [e["line"] for e in out["errors"]] == [1, 2]
    assert RejectedInput.objects.count() == 2


def test_invalid_thresholds_are_400_naming_field_and_range(client, fleet, users):
    client.force_login(users["operator"])  # the role that tunes thresholds
    group = fleet["group"]
    before = group.thresholds_version
    resp = client.patch(f"/api/v1/groups/{group.name}/thresholds/",
                        data={"changes": {"quarantine_z": -3}, "reason": "fuzz"}, content_type="application/json")
    assert resp.status_code == 400
    text = resp.content.decode()
    assert "quarantine_z" in text
    assert any(ch.isdigit() for ch in text.split("quarantine_z", 1)[1]), "the allowed range is stated"
    resp = client.patch(f"/api/v1/groups/{group.name}/thresholds/",
                        data={"changes": {"no_such_knob": 1}, "reason": "typo"}, content_type="application/json")
    assert resp.status_code == 400 and "no_such_knob" in resp.content.decode()
    group.refresh_from_db()
    assert group.thresholds_version == before
