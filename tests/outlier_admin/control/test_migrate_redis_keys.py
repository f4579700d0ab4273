"""``manage.py migrate_redis_keys``: a group's keys written by the release before hash tags are renamed to
the layout of contract/keys.py at the upgrade, the stream with its consumer group and pending
entries, the checkpoint and the de-duplication sets; a name the new release already wrote is kept."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from contract import keys

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("migrate_redis_keys", *args, stdout=out)
    return out.getvalue()


def test_the_old_layout_is_renamed_once_with_the_streams_pending_entries(redis_client, make_group):
    make_group("g1")
    old = keys.pre_cluster_names("g1")  # new name -> old name
    old_stream, old_state = old[keys.stream("g1")], old[keys.state("g1")]
    for i in range(3):
        redis_client.xadd(old_stream, {"rows": f"[{i}]".encode()})
    redis_client.xgroup_create(old_stream, "ticks", id="0")
    redis_client.xreadgroup("ticks", "worker-a", {old_stream: ">"}, count=1)  # one delivered, not acknowledged
    redis_client.hset(old_state, mapping={"detector": b"\x00checkpoint", "last_id": b"0-0", "version": 41})
    old_dedup = keys.pre_cluster_dedup_pattern("g1").replace("*", "29473")
    redis_client.sadd(old_dedup, "req-1", "req-2")
    redis_client.rpush(old[keys.outbox("g1")], b"old item")
    redis_client.rpush(keys.outbox("g1"), b"written since the upgrade")

    assert "would rename 4 key(s)" in _run("--dry-run") and redis_client.exists(old_stream)
    out = _run()
    assert "renamed 3 key(s); 1 left under the old name" in out, out
    assert redis_client.xlen(keys.stream("g1")) == 3
    assert redis_client.xpending(keys.stream("g1"), "ticks")["pending"] == 1, "the consumer group came along"
    assert redis_client.hget(keys.state("g1"), "detector") == b"\x00checkpoint"
    assert redis_client.smembers(keys.dedup("g1", 29473)) == {b"req-1", b"req-2"}
    assert not redis_client.exists(old_stream, old_state, old_dedup)
    assert redis_client.lrange(keys.outbox("g1"), 0, -1) == [b"written since the upgrade"]
    assert redis_client.exists(old[keys.outbox("g1")]), "kept for the operator, not overwritten"
    assert "renamed 0 key(s)" in _run()


def test_a_group_named_like_a_glob_migrates_only_its_own_dedup_sets(redis_client, make_group):
    make_group("g1")
    other = keys.pre_cluster_dedup_pattern("g10").replace("*", "5")
    redis_client.sadd(other, "x")
    assert "renamed 0 key(s)" in _run()
    assert redis_client.exists(other)
