from __future__ import annotations

import pytest
import redis

from outlier_admin.control import redis_conn


def test_healthz_answers_without_touching_services(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}


def test_readyz_is_ready_when_database_and_redis_answer(client, db, redis_client):
    resp = client.get("/readyz")
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]


def test_readyz_is_503_and_names_redis_when_redis_is_unreachable(client, db):
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    redis_conn.set_redis(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5))
    try:
        resp = client.get("/readyz")
    finally:
        redis_conn.set_redis(None)
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is False
    assert "Connection" in body["checks"]["redis"]["error"]


def test_probes_refuse_other_methods(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_metrics_token_when_configured(client, settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    resp = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert resp.status_code == 200 and b"outlier_" in resp.content
