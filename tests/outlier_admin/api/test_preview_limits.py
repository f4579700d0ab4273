"""The threshold preview's rate limit (issue 29, finding 10): a token bucket per user in the real Redis
(``PREVIEW_BURST``, one back per ``PREVIEW_REFILL_S``), a slot per web process
(``PREVIEW_MAX_CONCURRENT``), a 429 in the API's error format; and its cost: ``PREVIEW_MAX_ROWS`` is one
budget for every history read of a preview, the ``norm`` rows read once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.history import preview

pytestmark = pytest.mark.django_db
CHANGES = {"changes": {"quarantine_z": 2.5}}


def as_user(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def url(fleet) -> str:
    return f"/api/v1/groups/{fleet['group'].name}/thresholds/preview/"


def test_a_user_over_the_burst_gets_a_429_problem_with_retry_after(fleet, users, redis_client, settings):
    settings.PREVIEW_BURST, settings.PREVIEW_REFILL_S = 3, 20
    c = as_user(users["operator"])
    first_taken = time.monotonic()
    assert [c.post(url(fleet), CHANGES, format="json").status_code for _ in range(3)] == [200, 200, 200]
    resp = c.post(url(fleet), CHANGES, format="json")
    taken_for_s = time.monotonic() - first_taken
    assert resp.status_code == 429
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert (body["type"], body["title"], body["status"]) == ("about:blank", "Too Many Requests", 429)
    assert body["errors"][0]["code"] == "throttled"
    assert "limited to 3 at once and one per 20 s per user (PREVIEW_BURST, PREVIEW_REFILL_S)" in body["detail"]
    # The bucket refills from the first take: the next token is 20 s after it, less the time the
    # three previews took (seconds on a loaded host), said in the header and the body.
    assert 20 - taken_for_s - 1 <= int(resp["Retry-After"]) <= 20
    assert body["retry_after_s"] == int(resp["Retry-After"])
    assert body["instance"] == url(fleet)
    # Per user: the on-call's bucket is full.
    assert as_user(users["oncall"]).post(url(fleet), CHANGES, format="json").status_code == 200


def test_tokens_come_back_at_the_refill_rate(users, redis_client, settings):
    """The bucket itself (a Redis round trip each), not previews: a preview on a loaded host can take
    longer than the refill period, which would make the refusal this test waits for a race."""
    settings.PREVIEW_BURST, settings.PREVIEW_REFILL_S = 1, 1
    uid = users["operator"].pk
    assert preview.take_token(uid) == 0
    assert 0 < preview.take_token(uid) <= 1000  # empty: the wait until the next token, in ms
    time.sleep(1.1)
    assert preview.take_token(uid) == 0
    assert 0 < preview.take_token(uid) <= 1000


def test_a_users_token_and_login_share_one_bucket(client, fleet, users, redis_client, settings):
    from outlier_admin.control.actions import do_create_token

    settings.PREVIEW_BURST = 2
    _, token = do_create_token(name="operator-cli", scope="api", actor="test", user=users["operator"])
    by_token = client.post(url(fleet), CHANGES, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert by_token.status_code == 200
    assert as_user(users["operator"]).post(url(fleet), CHANGES, format="json").status_code == 200
    again = client.post(url(fleet), CHANGES, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert again.status_code == 429


def test_concurrent_takes_never_exceed_the_burst(users, redis_client, settings):
    """The bucket is one Lua script: 8 requests of one user at once take exactly the 3 tokens there are."""
    settings.PREVIEW_BURST, settings.PREVIEW_REFILL_S = 3, 60
    start = threading.Barrier(8)
    got: list[int] = []

    def take() -> None:
        start.wait()
        got.append(preview.take_token(users["operator"].pk))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got)[:4] == [0, 0, 0, sorted(got)[3]] and sorted(got)[3] > 0
    assert got.count(0) == 3
    assert all(55_000 <= w <= 60_000 for w in got if w)  # ~a full refill period to the next token
    assert 0 < redis_client.pttl(preview.rate_key(users["operator"].pk)) <= 3 * 60_000 + 1000


def test_a_busy_process_refuses_without_spending_a_token(fleet, users, redis_client, settings):
    settings.PREVIEW_MAX_CONCURRENT = 1
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with preview.admit_preview(users["oncall"]):
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
        assert resp.status_code == 429 and int(resp["Retry-After"]) == 5
        assert "1 threshold preview(s) already running on this server (PREVIEW_MAX_CONCURRENT=1)" in resp.json()["detail"]
        assert not redis_client.exists(preview.rate_key(users["operator"].pk))  # no token taken
    finally:
        release.set()
        holder.join()
    assert as_user(users["operator"]).post(url(fleet), CHANGES, format="json").status_code == 200


def test_refused_input_spends_no_token(fleet, users, redis_client, settings):
    settings.PREVIEW_BURST = 1
    c = as_user(users["operator"])
    for _ in range(4):
        assert c.post(url(fleet), {"changes": {}}, format="json").status_code == 400
        assert c.post(url(fleet), {"changes": {"quarantine_z": "x"}}, format="json").status_code == 400
    assert c.post(url(fleet), CHANGES, format="json").status_code == 200


def test_without_redis_the_preview_is_refused_503(fleet, users, settings):
    from harness.gateways import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens: refused at once
    c = APIClient(raise_request_exception=False)  # a 5xx is reported to got_request_exception too
    c.force_authenticate(users["operator"])
    resp = c.post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 503 and int(resp["Retry-After"]) == 10
    assert resp.json()["errors"][0]["code"] == "unavailable"
    assert "rate limiter (Redis) is unreachable" in resp.json()["detail"]


def test_the_dashboard_preview_takes_from_the_same_bucket(fleet, users, redis_client, settings):
    settings.PREVIEW_BURST = 1
    c = Client()
    c.force_login(users["operator"])
    page = f"/groups/{fleet['group'].name}/thresholds/"
    assert c.post(page, {"quarantine_z": "2.8", "preview": "1"}).status_code == 200
    resp = c.post(page, {"quarantine_z": "2.8", "preview": "1"})
    assert resp.status_code == 429 and b"PREVIEW_BURST" in resp.content
    assert as_user(users["operator"]).post(url(fleet), CHANGES, format="json").status_code == 429


# --- cost: one row budget for all the reads ---------------------------------------------------------------

def _decode_history(fleet, with_prefill: bool) -> None:
    """The fleet's 8 x 180 norm rows again as ``decode`` (and ``prefill_time``) rows with stored
    baselines: the group decides on decode, as one whose gateways log TTFT."""
    signals = ["decode"] + (["prefill_time"] if with_prefill else [])
    norm = list(NodeHistory.objects.filter(node__group=fleet["group"], signal="norm"))
    for sig in signals:
        NodeHistory.objects.bulk_create([
            NodeHistory(node_id=r.node_id, signal=sig, at=r.at, ema=r.ema, z=r.z, p50=None, p99=None,
                        samples=r.samples, weight=r.weight, state=r.state) for r in norm])
        ats = sorted({r.at for r in norm})
        GroupBaseline.objects.bulk_create([GroupBaseline(group=fleet["group"], signal=sig, at=at, baseline=1.0,
                                                         spread=0.1, peers=8) for at in ats])
    fleet["group"].decision_signal = "decode"  # as the tick stores it from the detector's Evaluation
    fleet["group"].save(update_fields=["decision_signal"])


def test_the_row_bound_counts_every_read_of_the_preview(fleet, users, redis_client, settings):
    _decode_history(fleet, with_prefill=True)
    history = NodeHistory._meta.db_table
    # decode 1,440 + norm (tail window) 1,440 + prefill_time 1,440 = 4,320 rows; each read alone is
    # under 2,000, which the per-query bound let through (reading 5,760 rows: norm twice).
    settings.PREVIEW_MAX_ROWS = 2000
    with CaptureQueriesContext(connection) as queries:
        resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 400
    loads = [q["sql"] for q in queries.captured_queries
             if f'FROM "{history}"' in q["sql"] and not q["sql"].startswith("SELECT COUNT(*)")]
    assert loads == [], "refused on counts alone, before any row is loaded"
    assert "more than PREVIEW_MAX_ROWS=2000 history rows" in resp.json()["detail"]
    assert "(decode, norm, prefill_time rows in the window)" in resp.json()["detail"]
    settings.PREVIEW_MAX_ROWS = 3 * 1440  # exactly the rows it needs: served, in one read
    with CaptureQueriesContext(connection) as queries:
        resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 200 and resp.json()["signal"] == "decode" and resp.json()["rows"] == 1440
    reads = [q["sql"] for q in queries.captured_queries
             if f'FROM "{history}"' in q["sql"] and not q["sql"].startswith("SELECT COUNT(*)")]
    # The read model reads every signal's rows at once (history.replay.load).
    assert len(reads) == 1 and all(sig in reads[0] for sig in ("decode", "norm", "prefill_time")), reads
    settings.PREVIEW_MAX_ROWS = 3 * 1440 - 1
    assert as_user(users["oncall"]).post(url(fleet), CHANGES, format="json").status_code == 400


def test_a_window_over_the_bound_is_refused_before_any_history_read(fleet, users, redis_client):
    """What an input can ask for: at most PREVIEW_MAX_WINDOW_S of history (the serializer's 86,400 s is
    refused by the preview's 3,600 s before a row is counted)."""
    with CaptureQueriesContext(connection) as queries:
        resp = as_user(users["operator"]).post(url(fleet), {**CHANGES, "window_s": 86400}, format="json")
    assert resp.status_code == 400 and resp.json()["errors"][0]["attr"] == "window_s"
    assert not [q for q in queries.captured_queries if NodeHistory._meta.db_table in q["sql"]]
