"""``manage.py tail_logs`` with Redis away (a private redis-server, stopped and started again): the
follow loop says each failed pass and keeps going from the checkpoint, ``--once`` fails with a clear
error, and once Redis is back every line written meanwhile is accepted exactly once. In the routers'
drill one Redis timeout ended the tailer and its group got no more samples."""

from __future__ import annotations

import io
import time

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from outlier_admin.ingest.management.commands.tail_logs import Command, follow
from outlier_admin.ingest.models import Checkpoint, IngestSource

pytestmark = [pytest.mark.django_db, pytest.mark.services, pytest.mark.timeout(60)]


def _lines(n: int) -> bytes:
    now = time.time()
    return b"".join(orjson.dumps({"ts": now + k, "node": "127.0.0.1:9001", "group": "g", "prompt_tokens": 10,
                                  "completion_tokens": 5, "total_ms": 100.0 + k, "status": 200}) + b"\n"
                    for k in range(n))


def test_the_tailer_outlives_redis_going_away_and_loses_no_line(tmp_path, private_redis, make_group):
    make_group("g")
    path = tmp_path / "access.log"
    path.write_bytes(_lines(2))
    out = io.StringIO()
    call_command("tail_logs", "--add", "edge", "--path", str(path), "--format", "jsonl", "--group", "g", "--once",
                 stdout=out)
    assert out.getvalue().splitlines() == ["edge: accepted 2 (0 latency-only) rejected 0"]
    checkpoint = Checkpoint.objects.get(source__name="edge").offset

    private_redis.stop()
    with open(path, "ab") as fh:
        fh.write(_lines(3))
    cmd, said, waits = Command(stdout=io.StringIO(), stderr=io.StringIO()), [], []
    sources = IngestSource.objects.filter(name="edge")
    failed = follow(lambda: cmd.one_pass(sources, once=False), 2.0, said.append, passes=3, sleep=waits.append)
    assert failed == 3 and len(said) == 3
    assert all("trying again" in s and "from the checkpoint" in s for s in said), said
    assert waits == [4.0, 8.0, 16.0]  # the interval, doubling (capped at MAX_BACKOFF_S)
    assert Checkpoint.objects.get(source__name="edge").offset == checkpoint  # nothing past it was taken
    with pytest.raises(CommandError, match="run it again"):
        call_command("tail_logs", "--source", "edge", "--once", stdout=io.StringIO())

    private_redis.start()
    cmd = Command(stdout=io.StringIO(), stderr=io.StringIO())
    waits.clear()
    assert follow(lambda: cmd.one_pass(sources, once=False), 2.0, said.append, passes=2, sleep=waits.append) == 0
    assert waits == [2.0, 2.0]  # back to the interval
    assert cmd.stdout.getvalue().splitlines() == ["edge: accepted 3 (0 latency-only) rejected 0"]
    # Counted from the row, not from the copy the loop read its sources with (it said 3, then 2 + 3).
    assert IngestSource.objects.get(name="edge").accepted_total == 5
    assert Checkpoint.objects.get(source__name="edge").offset == path.stat().st_size
