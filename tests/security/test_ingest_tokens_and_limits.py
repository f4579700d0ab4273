"""Issue 29 (trust boundary, round two): the ingest path and tokens. One test (or a few) per finding
of the probe; each failed on the main before this change. Every address is on 127.0.0.0/8."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from contract import keys
from contract.stream import decode_requests
from outlier_admin.control.actions import ActionError, do_create_token, do_set_auto_register
from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import ApiToken, Node
from outlier_admin.ingest.models import RejectedInput
from outlier_admin.ingest.pipeline import SAMPLES_PER_REASON
from outlier_admin.ingest.rejected import refusal_count
from outlier_admin.ingest.retention import apply_retention

pytestmark = [pytest.mark.django_db, pytest.mark.services]
URL = "/api/v1/ingest/requests"


def rec(**kw):
    return {"ts": time.time(), "node": "127.0.0.1:8000", "group": "g1", "prompt_tokens": 100,
            "completion_tokens": 20, "ttft_ms": 100.0, "total_ms": 900.0, "status": 200, **kw}


def post(client, token, body, content_type="application/json"):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(URL, data=data, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}")


def stream_rows(redis_client, group):
    return [row for _, fields in redis_client.xrange(keys.stream(group)) for row in decode_requests(fields)]


# --- 3. a body's cost is per byte: a cap on lines, refusals counted per reason --------------------------


def test_a_body_over_the_line_cap_is_413_naming_the_cap_before_any_line_is_parsed(
    client, ingest_token, redis_client, make_group, settings
):
    make_group("g1")
    settings.INGEST_MAX_LINES = 1000
    resp = post(client, ingest_token, b"{}\n" + b"x\n" * 1000, "application/x-ndjson")
    assert resp.status_code == 413, resp.content
    problem = resp.json()
    assert problem["max_lines"] == 1000 and "1001 lines" in problem["detail"] and "INGEST_MAX_LINES" in problem["detail"]
    # A JSON array is capped by its records, whatever its layout.
    resp = post(client, ingest_token, [rec()] * 1001)
    assert resp.status_code == 413 and "1001 records" in resp.json()["detail"]
    assert not RejectedInput.objects.exists() and stream_rows(redis_client, "g1") == []
    # At the cap the body is taken.
    assert post(client, ingest_token, [rec()] * 1000).json()["accepted"] == 1000


def test_refusals_are_stored_as_a_few_samples_per_reason_with_their_counts(
    client, ingest_token, redis_client, make_group
):
    """The probe's body (``{}`` then ``x`` N times) stored one row per line (500,001 rows)."""
    make_group("g1")
    body = b"{}\n" + b"x\n" * 3000 + b"".join(b"bad %d\n" % k for k in range(10)) + orjson.dumps(rec()) + b"\n"
    out = post(client, ingest_token, body, "application/x-ndjson").json()
    assert (out["accepted"], out["rejected"]) == (1, 3011)
    assert out["errors"][:3] == [{"line": 1, "reason": "missing_ts"}, {"line": 2, "reason": "bad_json"},
                                 {"line": 3, "reason": "bad_json"}] and len(out["errors"]) == 20
    rows = RejectedInput.objects.order_by("line")
    assert [(r.reason, r.line, r.count) for r in rows] == [
        ("missing_ts", 1, 1),
        ("bad_json", 2, 3000),  # x, 3,000 times: one sample
        ("bad_json", 3002, 1),  # "bad 0"
        ("bad_json", 3003, 9),  # "bad 1", and the 8 texts past SAMPLES_PER_REASON counted on it
    ]
    assert SAMPLES_PER_REASON == 3 and refusal_count() == 3011


# --- 8. a token dies with its user ----------------------------------------------------------------------


def test_a_deactivated_users_api_token_is_refused_for_reads_and_writes(fleet, users):
    oncall = users["oncall"]
    _, token = do_create_token(name="oncall-bot", scope="api", actor="test", user=oncall)
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    n0 = fleet["nodes"][1].pk
    assert c.get("/api/v1/nodes/").status_code == 200  # works while the user is active
    oncall.is_active = False
    oncall.save()
    assert not APIClient().login(username="oncall", password="pw-oncall")  # password refused ...
    resp = c.get("/api/v1/nodes/")
    assert resp.status_code == 401 and "token" in resp.json()["detail"].lower()  # ... and the token too
    before = AuditEvent.objects.count()
    resp = c.post(f"/api/v1/nodes/{n0}/quarantine/", {"reason": "r", "expires_in_s": 600}, format="json")
    assert resp.status_code == 401
    assert AuditEvent.objects.count() == before and Node.objects.get(pk=n0).state == "healthy"
    oncall.is_active = True  # reactivating the account brings the token back (it was not revoked)
    oncall.save()
    assert c.get("/api/v1/nodes/").status_code == 200


def test_an_ingest_token_of_a_deactivated_user_cannot_push(client, redis_client, make_group, users):
    make_group("g1")
    user = users["operator"]
    _, token = do_create_token(name="gw-of-a-person", scope="ingest", actor="test", user=user)
    assert post(client, token, [rec()]).json()["accepted"] == 1
    user.is_active = False
    user.save()
    assert post(client, token, [rec()]).status_code == 401
    assert len(stream_rows(redis_client, "g1")) == 1


def test_a_session_of_a_deactivated_user_holds_no_role(fleet, users):
    from outlier_admin.api.permissions import user_can

    oncall = users["oncall"]
    oncall.is_active = False
    assert not user_can(oncall, "override") and not user_can(oncall, "read")


# --- 9. ingest tokens scoped to groups -------------------------------------------------------------------


def test_a_scoped_ingest_token_pushes_only_for_its_groups(client, redis_client, make_group, settings):
    settings.AUTO_REGISTER_NODES = True
    make_group("g1")
    make_group("g2")
    make_group("g3")
    out = StringIO()
    call_command("create_token", "--scope", "ingest", "--name", "gw-a", "--group", "g1", "--group", "g3",
                 stdout=out, stderr=StringIO())
    scoped = out.getvalue().strip().splitlines()[-1]
    assert ApiToken.objects.get(name="gw-a").ingest_groups == ["g1", "g3"]
    audit = AuditEvent.objects.get(action="token.create")
    assert audit.detail["groups"] == ["g1", "g3"]

    body = [rec(group="g1"), rec(group="g2", node="127.0.0.2:8000"), rec(group="g3"), rec(group="g2")]
    resp = post(client, scoped, body)
    assert resp.status_code == 200  # per record: the rest of the batch goes on
    out = resp.json()
    assert (out["accepted"], out["rejected"]) == (2, 2)
    assert out["errors"] == [{"line": 2, "reason": "group_out_of_scope"}, {"line": 4, "reason": "group_out_of_scope"}]
    assert stream_rows(redis_client, "g2") == [] and not Node.objects.filter(group__name="g2").exists()
    assert len(stream_rows(redis_client, "g1")) == 1 and len(stream_rows(redis_client, "g3")) == 1
    kept = RejectedInput.objects.filter(reason="group_out_of_scope")
    assert refusal_count(kept) == 2 and all("may push for g1, g3" in r.detail for r in kept)
    # A record without a group is judged by the group its node is in.
    Node.objects.create(group=make_group("g2"), name="127.0.0.9:8000", address="127.0.0.9:8000")
    out = post(client, scoped, [{**rec(node="127.0.0.9:8000"), "group": None}]).json()
    assert out["errors"] == [{"line": 1, "reason": "group_out_of_scope"}]

    # An unscoped token keeps today's behaviour: every group.
    _, unscoped = do_create_token(name="gw-any", scope="ingest", actor="test")
    assert post(client, unscoped, body).json()["accepted"] == 4


def test_a_scope_names_groups_that_exist_and_only_ingest_tokens_have_one(db, make_group, settings):
    make_group("g1")
    with pytest.raises(CommandError, match="no group 'g-typo'"):
        call_command("create_token", "--scope", "ingest", "--name", "gw", "--group", "g-typo",
                     stdout=StringIO(), stderr=StringIO())
    with pytest.raises(ActionError, match="only an ingest token"):
        do_create_token(name="x", scope="api", actor="test", groups=["g1"])
    with pytest.raises(ActionError):
        do_create_token(name="x", scope="ingest", actor="test", groups=["../g1"])
    settings.AUTO_CREATE_GROUPS = ["llama-*"]  # a group ingest may create is a valid scope
    row, _ = do_create_token(name="x", scope="ingest", actor="test", groups=["llama-b", "g1", "g1"])
    assert row.ingest_groups == ["g1", "llama-b"] and not ApiToken.objects.filter(name="gw").exists()


# --- 10. rejected input rate-limited and retained as configured; one address, one node; latency floor ---


def test_stored_refusals_are_rate_limited_per_source_and_counted_whole(
    client, ingest_token, redis_client, make_group, settings
):
    """10 MiB of rows per 0.64 s request, without a limit. Now: at most INGEST_REJECTED_ROWS_PER_HOUR
    new rows per source and hour; past it the counts go to the newest row of the reason."""
    make_group("g1")
    settings.INGEST_REJECTED_ROWS_PER_HOUR = 5
    total = 0
    for k in range(10):  # 3 distinct bad lines (3 samples) and a missing field per request
        body = b"".join(b"junk %d-%d\n" % (k, j) for j in range(3)) + b"{}\n"
        out = post(client, ingest_token, body, "application/x-ndjson").json()
        assert out["rejected"] == 4
        total += 4
    rows = RejectedInput.objects.filter(source="http:gw-test")
    assert rows.count() == 5 and refusal_count(rows) == total == 40
    # Another token has its own budget.
    _, other = do_create_token(name="gw-other", scope="ingest", actor="test")
    post(client, other, b"junk\n{}\n", "application/x-ndjson")
    assert RejectedInput.objects.filter(source="http:gw-other").count() == 2


def test_rejected_input_is_kept_as_configured(db, settings):
    settings.INGEST_REJECTED_KEEP_DAYS = 3
    now = timezone.now()
    for days in (1, 2.9, 3.1, 40):
        RejectedInput.objects.create(source="http:gw", reason="bad_json", raw="x", received_at=now - timedelta(days=days))
    assert apply_retention(now)["rejected_dropped"] == 2
    assert RejectedInput.objects.count() == 2


def test_one_address_is_one_node_however_it_is_written(client, ingest_token, redis_client, make_group, settings):
    """``:018950`` and ``[::ffff:127.0.0.1]:18950`` registered as two more nodes of 127.0.0.1:18950."""
    settings.AUTO_REGISTER_NODES = True
    group = make_group("g1")
    do_set_auto_register(group, ["127.0.0.0/8", "localhost"], actor="test", reason="the test's loopback")
    spellings = ["127.0.0.1:18950", "127.0.0.1:018950", "[::ffff:127.0.0.1]:18950", "[::FFFF:7f00:1]:0018950",
                 "localhost:18951", "LocalHost.:18951", "LOCALHOST:018951"]
    out = post(client, ingest_token, [rec(node=n) for n in spellings]).json()
    assert (out["accepted"], out["rejected"]) == (7, 0)
    assert sorted(Node.objects.values_list("name", "address")) == [
        ("127.0.0.1:18950", "127.0.0.1:18950"), ("localhost:18951", "localhost:18951")]
    assert sorted({row[0] for row in stream_rows(redis_client, "g1")}) == ["127.0.0.1:18950", "localhost:18951"]
    # Once registered, later spellings find the node (and a full group cannot be filled by them).
    settings.MAX_NODES_PER_GROUP = 2
    out = post(client, ingest_token, [rec(node="127.0.0.1:00018950"), rec(node="[::ffff:127.0.0.1]:018950")]).json()
    assert (out["accepted"], out["rejected"]) == (2, 0) and Node.objects.count() == 2
    assert AuditEvent.objects.filter(action="node.register").count() == 2


@pytest.mark.parametrize("batch", [1, 20])  # one record (normalize), a batch (the column screen)
@pytest.mark.parametrize(("field", "value", "ok"), [
    ("total_ms", 1e-300, False), ("total_ms", 5e-324, False), ("total_ms", 0.000999, False),
    ("total_ms", 0.001, True), ("ttft_ms", 1e-300, False), ("ttft_ms", 0, True), ("queue_ms", 1e-300, False),
    ("queue_ms", 0.0, True),
])
def test_latencies_are_bounded_below(client, ingest_token, redis_client, make_group, field, value, ok, batch):
    make_group("g1")
    one = rec(**{field: value})
    if field == "total_ms":
        one.pop("ttft_ms")  # judged on its own, not as total_below_ttft
    out = post(client, ingest_token, [one] + [rec()] * (batch - 1)).json()
    if ok:
        assert out["rejected"] == 0, out
    else:
        assert out["rejected"] == 1 and out["errors"] == [{"line": 1, "reason": f"bad_{field}"}], out
