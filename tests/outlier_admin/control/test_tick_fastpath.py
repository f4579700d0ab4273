"""The tick's fast path: Redis before any SQL write, one statement for the changed node rows, operator
inputs queried only when marked, the detector serialised only at checkpoints."""

from __future__ import annotations

import time

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from contract import keys
from harness.records import make_records
from outlier_admin.control.actions import do_quarantine
from outlier_admin.control.publish import read_weights
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]


@pytest.fixture(autouse=True)
def g1(make_group):
    return make_group("g1")


def feed(t: float, rng: np.random.Generator, **kw) -> None:
    recs = make_records(t, rng=rng, **kw)
    assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)


def _slot_start() -> float:
    """A start time 20-30 s ago on a ``HISTORY_EVERY_S`` (10 s) boundary: ticks at +0.5 .. +9.5 share
    one history slot, +10.5 opens the next."""
    return (time.time() // 10) * 10 - 20


def is_write(sql: str) -> bool:
    """An SQL statement that writes: INSERT/UPDATE/DELETE, or a ``WITH`` whose parts do (the tick
    writes its rows in one statement of data-modifying CTEs)."""
    head = sql.lstrip().upper()
    return head.startswith(("INSERT", "UPDATE", "DELETE")) or (
        head.startswith("WITH") and any(f"{verb} " in head for verb in ("INSERT INTO", "UPDATE", "DELETE FROM")))


def _writes(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if is_write(q["sql"])]


def test_the_weights_document_is_in_redis_before_any_sql_write(redis_client):
    rng = np.random.default_rng(1)
    t0 = _slot_start()
    feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    seen: list[int | None] = []

    def at_each_write(execute, sql, params, many, context):
        if is_write(sql):
            doc = read_weights("g1")
            seen.append(doc["version"] if doc else None)
        return execute(sql, params, many, context)

    feed(t0 + 10, rng, slow={3: 4.0})  # a new history slot: history, baselines and node rows are written
    with connection.execute_wrapper(at_each_write):
        res = run_tick("g1", now=t0 + 10.5)
    assert seen, "the tick wrote to SQL"
    assert seen == [res.version] * len(seen), "every SQL write came after the document was published"


def test_changed_node_rows_are_written_in_one_statement_and_unchanged_ones_not_at_all(redis_client):
    rng = np.random.default_rng(2)
    t0 = _slot_start()
    feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)  # first tick: every node gets its state, weight and last-seen
    assert Node.objects.filter(group__name="g1", last_seen__isnull=False).count() == 8
    with CaptureQueriesContext(connection) as queries:
        run_tick("g1", now=t0 + 1.5)  # nothing new: no node row moved
    assert not [q for q in _writes(queries) if 'UPDATE "fleet_node"' in q]
    feed(t0 + 7, rng)  # last-seen moves by more than its resolution for every node
    with CaptureQueriesContext(connection) as queries:
        run_tick("g1", now=t0 + 7.5)
    node_writes = [q for q in _writes(queries) if 'UPDATE "fleet_node"' in q]
    # One statement for every changed row (not the ORM's bulk_update: a CASE/WHEN per field and row).
    assert len(node_writes) == 1 and node_writes[0].count('UPDATE "fleet_node"') == 1
    assert "CASE WHEN" not in node_writes[0]
    latest = max(Node.objects.filter(group__name="g1").values_list("last_seen", flat=True))
    assert latest.timestamp() == pytest.approx(t0 + 7, abs=1.0)


def test_operator_inputs_are_queried_only_when_marked_and_applied_at_the_next_tick(redis_client):
    rng = np.random.default_rng(3)
    t0 = _slot_start()
    feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    with CaptureQueriesContext(connection) as queries:
        run_tick("g1", now=t0 + 1.5)  # same history slot, no mark, no node pending approval
    assert not [q for q in queries.captured_queries if "control_override" in q["sql"]]
    node = Node.objects.get(name="127.0.0.1:9002")
    do_quarantine(node, actor="alice", reason="bad GPU")
    assert int(redis_client.get(keys.inputs("g1"))) >= 1
    res = run_tick("g1", now=t0 + 2.5)
    assert res.states["127.0.0.1:9002"] == "forced_quarantine" and res.weights["127.0.0.1:9002"] == 0
    assert res.checkpoint, "a tick that applied an operator input checkpoints the detector"
    assert redis_client.get(keys.inputs("g1")) is None, "the tick consumed the marks it saw"


def test_the_detector_is_serialised_only_at_checkpoints(redis_client, settings):
    rng = np.random.default_rng(4)
    t0 = _slot_start()
    checkpoints = []
    for k in range(8):
        feed(t0 + k, rng)
        res = run_tick("g1", now=t0 + k + 0.5)
        checkpoints.append(res.checkpoint)
    # The first tick, then once a lease (5 s) has passed; nothing was decided in between.
    assert checkpoints == [True, False, False, False, False, True, False, False]
    assert float(redis_client.hget(keys.state("g1"), "checkpoint_at")) == pytest.approx(t0 + 5.5)
