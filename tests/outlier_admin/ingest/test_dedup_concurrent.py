"""Concurrent deliveries of the same request ids: every id lands in the stream exactly once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from contract import keys
from contract.stream import decode_requests
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def _records(ids):
    now = time.time()
    return [
        (i + 1, {"ts": now, "node": f"127.0.0.{1 + i % 4}:8000", "group": "dedup", "prompt_tokens": 100,
                 "completion_tokens": 50, "ttft_ms": 100.0, "total_ms": 800.0, "status": 200,
                 "request_id": rid}, None)
        for i, rid in enumerate(ids)
    ]


def test_the_same_ids_from_four_threads_are_accepted_once(redis_client, make_group):
    make_group("dedup")
    submit(_records(["warm-up"]), source="test")  # registers the group and nodes first
    ids = [f"req-{k}" for k in range(300)]
    outcomes, errors = [], []
    start = threading.Barrier(4)

    def deliver(order):
        try:
            start.wait()
            for chunk in range(0, 300, 50):
                outcomes.append(submit(_records(order[chunk : chunk + 50]), source="test"))
        except Exception as exc:  # surfaced below; a thread's exception would otherwise vanish
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own; left open it blocks dropping the test database

    threads = [threading.Thread(target=deliver, args=(ids[::-1] if k % 2 else ids,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert sum(o.accepted for o in outcomes) == 300
    assert sum(o.duplicates for o in outcomes) == 3 * 300
    rows = [row for _, fields in redis_client.xrange(keys.stream("dedup")) for row in decode_requests(fields)]
    assert len(rows) == 301  # 300 ids + the warm-up record
