"""Redis with Sentinel: the one URL-to-client function (``contract.topology.redis_from_url``), the start-up
check of a misconfigured Sentinel (``control.E002``: a clear error, never a hang), and the replica
acknowledgement (``redis_conn.require_replicas``) behind an ingest's 200 — on real redis-server and
Sentinel processes of this test's own (harness/sentinel_cluster.py)."""

from __future__ import annotations

import time

import orjson
import pytest
import redis
from redis.sentinel import MasterNotFoundError

from agent.client import GatewayClient
from contract import keys
from contract.topology import RedisURLError, parse_sentinel_url, redis_from_url, sentinel_problem
from harness.records import make_records
from harness.sentinel_cluster import MASTER, sentinel_cluster  # noqa: F401 - the fixture
from outlier_admin.control import redis_conn
from outlier_admin.control.checks import SENTINEL_CHECK_ID, check_redis_sentinel
from tests.reliability.conftest import free_port, wait_for

URL = "/api/v1/ingest/requests"


# --- the URL --------------------------------------------------------------------------------------------

def test_sentinel_url_is_parsed_with_its_parts():
    spec = parse_sentinel_url("redis+sentinel://:s3cret@127.0.0.1:26379,127.0.0.2:26380,[::1]:26381/mymaster/6"
                              "?sentinel_password=pw2")
    assert spec.sentinels == (("127.0.0.1", 26379), ("127.0.0.2", 26380), ("::1", 26381))
    assert (spec.master, spec.db, spec.password, spec.sentinel_password) == ("mymaster", 6, "s3cret", "pw2")
    assert "s3cret" not in spec.describe() and "pw2" not in spec.describe()
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/m").db == 0


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///m/0", "names no sentinel"),
    ("redis+sentinel://127.0.0.1:26379", "names no master"),
    ("redis+sentinel://127.0.0.1:26379/", "names no master"),
    ("redis+sentinel://127.0.0.1/m/0", "not host:port"),
    ("redis+sentinel://127.0.0.1:0/m/0", "not host:port"),
    ("redis+sentinel://127.0.0.1:70000/m/0", "not host:port"),
    ("redis+sentinel://127.0.0.1:26379/m/x", "database 'x'"),
    ("redis+sentinel://127.0.0.1:26379/m/10000", "database '10000'"),
    ("redis+sentinel://127.0.0.1:26379/m/0/extra", "/<master>[/<db>]"),
    ("redis+sentinel://127.0.0.1:26379/bad name/0", "master name"),
    ("redis+sentinel://127.0.0.1:26379/m/0?password=x", "unknown redis+sentinel:// URL option"),
    ("redis+sentinel://" + ",".join(f"127.0.0.1:{26000 + i}" for i in range(17)) + "/m", "at most 16"),
])
def test_bad_sentinel_urls_are_refused_with_the_reason(url, says):
    with pytest.raises(RedisURLError, match=None) as err:
        redis_from_url(url)
    assert says in str(err.value)


def test_a_plain_url_is_redis_from_url():
    client = redis_from_url("redis://127.0.0.1:6379/6", socket_timeout=1.0)
    kw = client.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"], kw["socket_timeout"]) == ("127.0.0.1", 6379, 6, 1.0)


# --- misconfigured Sentinel: clear, fast -------------------------------------------------------------------

#: A hang guard, not a figure: a refused connection answers at once, and a loaded CI host may take
#: seconds to schedule the test; what would hang is a wait for a timeout or a retry loop (minutes).
HANG_GUARD_S = 30.0


def test_no_sentinel_reachable_is_named_at_once():
    ports = [free_port(), free_port()]
    url = f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/{MASTER}/0"
    t0 = time.monotonic()
    problem = sentinel_problem(url)
    assert time.monotonic() - t0 < HANG_GUARD_S, "refused connections answer, they are not waited out"
    assert "no Redis Sentinel reachable" in problem
    assert f"127.0.0.1:{ports[0]}" in problem and f"127.0.0.1:{ports[1]}" in problem
    # The client itself: the first command fails (naming the master) with no retry loop: one attempt per
    # Sentinel, each refused. The connect timeout is set far above the guard's share so that a client
    # that waited it out, instead of taking the refusal, would fail the guard.
    client = redis_from_url(url, socket_timeout=HANG_GUARD_S, socket_connect_timeout=HANG_GUARD_S)
    t0 = time.monotonic()
    with pytest.raises(MasterNotFoundError, match=MASTER):
        client.ping()
    assert time.monotonic() - t0 < HANG_GUARD_S


def test_a_plain_redis_given_as_a_sentinel_is_named(settings):
    host, port = settings.REDIS_URL.split("//")[1].split("/")[0].split(":")
    problem = sentinel_problem(f"redis+sentinel://{host}:{port}/{MASTER}/0")
    assert "not a Redis Sentinel" in problem and f"{host}:{port}" in problem


@pytest.mark.slow
def test_unknown_master_name_and_the_system_check(sentinel_cluster, settings):  # noqa: F811
    assert sentinel_problem(sentinel_cluster.url()) is None
    settings.REDIS_URL = sentinel_cluster.url()
    assert check_redis_sentinel() == []
    wrong = sentinel_cluster.url(master="oa-typo")
    problem = sentinel_problem(wrong)
    assert "no master named 'oa-typo'" in problem and f"they monitor: {MASTER}" in problem
    settings.REDIS_URL = wrong
    errors = check_redis_sentinel()
    assert [e.id for e in errors] == [SENTINEL_CHECK_ID] and "oa-typo" in errors[0].msg
    with pytest.raises(MasterNotFoundError, match="oa-typo"):
        redis_from_url(wrong, socket_timeout=1.0).ping()


# --- the client follows the primary; the replica acknowledgement --------------------------------------------

@pytest.fixture
def on_cluster(sentinel_cluster, settings):  # noqa: F811
    from outlier_admin.ingest.pipeline import directory

    settings.REDIS_URL = sentinel_cluster.url()
    redis_conn.set_redis(None)
    directory.clear()
    yield sentinel_cluster
    redis_conn._local.__dict__.clear()  # drop this thread's client of the stopped cluster
    directory.clear()


@pytest.mark.slow
def test_get_redis_and_the_gateway_client_reach_the_primary(on_cluster):
    r = redis_conn.get_redis()
    r.set("k", "v")
    assert on_cluster.node(on_cluster.primary_port).get("k") == b"v"
    assert r.connection_pool.get_master_address() == ("127.0.0.1", on_cluster.primary_port)
    gateway = GatewayClient.from_url(on_cluster.url(), "g1")
    assert gateway.redis_client.connection_pool.get_master_address()[1] == on_cluster.primary_port


def test_no_acknowledgement_asked_when_the_setting_is_0(settings):
    settings.REDIS_MIN_REPLICAS_ACK = 0
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    assert redis_conn.require_replicas(dead) == 0  # no round trip: a dead server is never asked


@pytest.mark.slow
def test_require_replicas_waits_for_the_replica_and_refuses_without_it(on_cluster, settings):
    settings.REDIS_MIN_REPLICAS_ACK, settings.REDIS_REPLICA_ACK_TIMEOUT_MS = 1, 300
    r = redis_conn.get_redis()
    # The write goes out on one connection and the WAIT on another: the WAIT still covers it.
    other = redis_from_url(on_cluster.url())
    other.set("written-elsewhere", "1")
    assert redis_conn.require_replicas(r) == 1
    assert on_cluster.node(on_cluster.replica_ports[0]).get("written-elsewhere") == b"1"
    on_cluster.pause(on_cluster.replica_ports[0])  # connected, acknowledges nothing
    try:
        other.set("k2", "2")
        t0 = time.monotonic()
        with pytest.raises(redis_conn.NotReplicated) as err:
            redis_conn.require_replicas(r)
        took = time.monotonic() - t0
        # It waited for the acknowledgement (the ack timeout, 0.25 s at least) and then refused; the
        # upper end only guards a hang (a loaded machine may take seconds to schedule the client).
        assert 0.25 <= took < 30, took
        assert (err.value.acked, err.value.wanted) == (0, 1)
    finally:
        on_cluster.resume(on_cluster.replica_ports[0])
    # A replica that was stopped acknowledges again within a second or two (its next REPLCONF ACK).
    assert wait_for(lambda: _acked(r), 5)


def _acked(client=None) -> bool:
    try:
        return redis_conn.require_replicas(client) >= 1
    except redis_conn.NotReplicated:
        return False


@pytest.mark.slow
@pytest.mark.django_db
def test_ingest_answers_503_until_a_replica_holds_the_records(on_cluster, settings, client, ingest_token,
                                                              make_group):
    from outlier_admin.control.actions import do_register_node

    settings.REDIS_MIN_REPLICAS_ACK, settings.REDIS_REPLICA_ACK_TIMEOUT_MS = 1, 300
    group = make_group("g1")
    for i in range(2):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="test")
    body = make_records(time.time(), nodes=2, per_node=5)
    for k, rec in enumerate(body):
        rec["request_id"] = f"rid-{k}"

    def post():
        return client.post(URL, data=orjson.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {ingest_token}")

    replica = on_cluster.replica_ports[0]
    on_cluster.pause(replica)
    try:
        resp = post()
        assert resp.status_code == 503, resp.content
        assert int(resp["Retry-After"]) > 0 and "replica" in resp.json()["detail"]
        # Taken by the primary, not yet held by a replica: a retry now is refused the same way.
        assert post().status_code == 503
    finally:
        on_cluster.resume(replica)
    assert wait_for(lambda: _acked(), 5), "the replica acknowledges again after its pause"
    resp = post()  # the client's retry: counted once, and answered 200 only now that the replica holds them
    assert resp.status_code == 200
    assert (resp.json()["accepted"], resp.json()["duplicates"]) == (0, len(body))
    stream = on_cluster.node(replica).xrange(keys.stream("g1"))
    assert sum(len(orjson.loads(f[b"rows"])) for _, f in stream) == len(body)


# --- the settings ------------------------------------------------------------------------------------------

def _settings_of(env: dict[str, str]) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            "print(json.dumps({k: getattr(s, k, None) for k in ('REDIS_URL', 'CELERY_BROKER_URL', "
            "'CELERY_BROKER_TRANSPORT_OPTIONS', 'REDIS_MIN_REPLICAS_ACK')}))")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "CELERY_"))}
    proc = subprocess.run([sys.executable, "-c", code], env={**base, "DJANGO_SETTINGS_MODULE": "outlier_admin.settings",
                                                            "OUTLIER_TESTING": "1", **env},
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"error": proc.stderr}


@pytest.mark.slow
def test_sentinel_settings_make_the_url_and_kombus_broker(sentinel_cluster):  # noqa: F811
    hosts = ",".join(f"127.0.0.1:{p}" for p in sentinel_cluster.sentinel_ports)
    got = _settings_of({"REDIS_SENTINELS": hosts, "REDIS_SENTINEL_MASTER": MASTER, "REDIS_DB": "6",
                        "REDIS_MIN_REPLICAS_ACK": "1"})
    assert got["REDIS_URL"] == f"redis+sentinel://{hosts}/{MASTER}/6"
    assert got["CELERY_BROKER_URL"] == ";".join(f"sentinel://127.0.0.1:{p}/6" for p in sentinel_cluster.sentinel_ports)
    assert got["CELERY_BROKER_TRANSPORT_OPTIONS"]["master_name"] == MASTER
    assert got["REDIS_MIN_REPLICAS_ACK"] == 1
    # A process whose Sentinels know no such master refuses to start, naming it.
    bad = _settings_of({"REDIS_SENTINELS": hosts, "REDIS_SENTINEL_MASTER": "nope"})
    assert "control.E002" in bad["error"] and "no master named 'nope'" in bad["error"]
    missing = _settings_of({"REDIS_SENTINELS": hosts})
    assert "REDIS_SENTINEL_MASTER" in missing["error"]
