"""Issue 16 items 2 and 5: a rejection silences new proposals of the node and cause (detector and GPU
fault alike); a detector proposal whose condition cleared is superseded and cannot be approved; overrides
and decided proposals record their outcome and the transition they caused, in the tick's transaction."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from contract import keys
from harness.records import make_records
from outlier_admin.control.actions import (
    ActionError,
    do_approve_proposal,
    do_expire_silence,
    do_pin_weight,
    do_propose_quarantine,
    do_quarantine,
    do_register_node,
    do_reject_proposal,
    do_release,
    do_retire_node,
)
from outlier_admin.control.models import AuditEvent, Override, QuarantineProposal, Silence, Transition
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.dcgm import record_scrape
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]
SLOW = "127.0.0.1:9003"
XID = '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-y"} 79\n'


@pytest.fixture
def approval_group(make_group):
    return make_group("g1", policy="approval")


def _feed(t: float, rng: np.random.Generator, **kw) -> None:
    recs = make_records(t, rng=rng, **kw)
    assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)


def _until(t0: float, rng, want, *, slow: bool, start: int, limit: int = 30) -> int:
    """Feed and tick once a second (``slow``: node 3 three times slower) until ``want(result)``;
    returns the next second."""
    for k in range(start, start + limit):
        _feed(t0 + k, rng, slow={3: 3.0} if slow else {})
        res = run_tick("g1", now=t0 + k + 0.5)
        if want(res):
            return k + 1
    raise AssertionError(f"condition not reached in {limit} ticks")


def test_rejecting_a_latency_proposal_silences_it_until_expired(redis_client, approval_group):
    rng, t0 = np.random.default_rng(7), time.time()
    k = _until(t0, rng, lambda r: r.states[SLOW] == "pending_approval", slow=True, start=0)
    first = QuarantineProposal.objects.get(node__name=SLOW, status="pending")
    first = do_reject_proposal(first, actor="alice", reason="known slow rack, fine for now", silence_s=1800)
    silence = Silence.objects.get(node__name=SLOW)
    assert (silence.cause, silence.proposal_id, silence.actor) == ("detector", first.pk, "alice")
    assert (silence.expires_at - first.decided_at).total_seconds() == 1800

    # 20 more seconds of the same slow node: no new proposal, and it does not wait at the floor weight.
    states = []
    for j in range(k, k + 20):
        _feed(t0 + j, rng, slow={3: 3.0})
        states.append(run_tick("g1", now=t0 + j + 0.5).states[SLOW])
    assert QuarantineProposal.objects.filter(node__name=SLOW).count() == 1
    assert states.count("pending_approval") <= sum(1 for s in states if s != "pending_approval")
    assert not any(a == b == "pending_approval" for a, b in itertools.pairwise(states))
    first.refresh_from_db()
    assert (first.status, first.outcome) == ("rejected", "applied")
    assert first.transition.to_state == "healthy" and first.transition.reason == "rejected"

    redis_client.delete(keys.inputs("g1"))
    do_expire_silence(silence, actor="alice", reason="rack fixed, watch it again")
    assert redis_client.get(keys.inputs("g1")), "the tick is told to read the silences again"
    with pytest.raises(ActionError, match="already ended"):
        do_expire_silence(silence, actor="alice", reason="twice")
    _until(t0, rng, lambda r: QuarantineProposal.objects.filter(node__name=SLOW, status="pending").exists(),
           slow=True, start=k + 20)
    second = QuarantineProposal.objects.get(node__name=SLOW, status="pending")
    assert second.pk != first.pk
    actions = list(AuditEvent.objects.filter(node__name=SLOW).order_by("pk").values_list("action", flat=True))
    decisions = [a for a in actions if a.startswith(("proposal.", "silence."))]
    assert decisions == ["proposal.open", "proposal.rejected", "silence.expire", "proposal.open"]


def test_rejecting_a_gpu_fault_proposal_silences_the_dcgm_path(redis_client, make_group):
    node = do_register_node(make_group("g"), "127.0.0.1:8000", actor="t")
    record_scrape(node, XID)
    p = QuarantineProposal.objects.get(node=node)
    do_reject_proposal(p, actor="bob", reason="XID 79 was a driver reload")
    for _ in range(3):  # the counter stays set: every scrape would propose again
        record_scrape(node, XID)
    assert QuarantineProposal.objects.filter(node=node).count() == 1
    # The detector's cause is not silenced by a GPU-fault rejection.
    assert do_propose_quarantine(node, actor="system:detector", source="detector", reason="z") is not None
    Silence.objects.filter(node=node).update(expires_at=Silence.objects.get(node=node).created_at)
    record_scrape(node, XID)
    assert QuarantineProposal.objects.filter(node=node, source="gpu_fault").count() == 2


def test_silence_length_is_bounded(make_group):
    node = do_register_node(make_group("g"), "127.0.0.1:8000", actor="t")
    p = do_propose_quarantine(node, actor="system:dcgm", source="gpu_fault", reason="xid")
    for bad in (0, 59, 31 * 86400, True, "3600"):
        with pytest.raises(ActionError, match="silence_s"):
            do_reject_proposal(p, actor="bob", reason="no", silence_s=bad)
    assert QuarantineProposal.objects.get(pk=p.pk).status == "pending"  # nothing half-done


def test_a_cleared_proposal_is_superseded_and_cannot_be_approved(redis_client, approval_group, client,
                                                                  django_user_model):
    rng, t0 = np.random.default_rng(7), time.time()
    k = _until(t0, rng, lambda r: r.states[SLOW] == "pending_approval", slow=True, start=0)
    p = QuarantineProposal.objects.get(node__name=SLOW, status="pending")
    # Fast again: cleared once its Z has been under the exit line for degrade_exit_dwell_s (30 s).
    _until(t0, rng, lambda r: r.states[SLOW] != "pending_approval", slow=False, start=k, limit=60)
    p.refresh_from_db()
    assert p.status == "superseded" and p.decided_actor == "system:detector"
    assert p.transition.from_state == "pending_approval" and p.transition.reason == "condition_cleared"
    with pytest.raises(ActionError, match="superseded"):
        do_approve_proposal(p, actor="alice", reason="too late")
    assert not AuditEvent.objects.filter(action="proposal.approved").exists()
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("viewer2", password="pw-12345-long")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client.force_login(user)
    assert "none: superseded (pending_approval → healthy)" in client.get("/approvals/").content.decode()


def test_overrides_record_outcome_and_transition(redis_client, make_group):
    group = make_group("g1")
    rng, t0 = np.random.default_rng(3), time.time()
    _feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    nodes = {n.name: n for n in Node.objects.filter(group=group)}
    q = do_quarantine(nodes["127.0.0.1:9001"], actor="alice", reason="fan")
    pin = do_pin_weight(nodes["127.0.0.1:9002"], 40, actor="alice", reason="half load")
    gone = do_quarantine(nodes["127.0.0.1:9004"], actor="alice", reason="retiring anyway")
    do_retire_node(nodes["127.0.0.1:9004"], actor="alice", reason="decommissioned")
    run_tick("g1", now=t0 + 1.5)
    q.refresh_from_db()
    pin.refresh_from_db()
    gone.refresh_from_db()
    assert q.outcome == "applied" and q.applied_at is not None
    assert (q.transition.from_state, q.transition.to_state, q.transition.node_id) == (
        "healthy", "forced_quarantine", nodes["127.0.0.1:9001"].pk)
    assert (pin.outcome, pin.transition) == ("applied", None)  # a pin moves a weight, not a state
    assert gone.outcome == "failed" and "not in the detector" in gone.outcome_reason
    # Releasing links its own transition, not the quarantine's.
    rel = do_release(nodes["127.0.0.1:9001"], actor="alice", reason="fan replaced")
    run_tick("g1", now=t0 + 2.5)
    rel.refresh_from_db()
    assert rel.transition.to_state == "healthy" and rel.transition.pk != q.transition.pk
    assert Transition.objects.filter(node=nodes["127.0.0.1:9001"]).count() == 2


def test_an_approval_after_the_node_left_pending_fails_visibly(redis_client, make_group, client,
                                                                django_user_model):
    make_group("g1")
    rng, t0 = np.random.default_rng(3), time.time()
    _feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    node = Node.objects.get(name="127.0.0.1:9001")
    # A proposal row the detector's state never matched (it is healthy): approving it changes nothing.
    p = do_propose_quarantine(node, actor="system:detector", source="detector", reason="z_quarantine")
    do_approve_proposal(p, actor="alice", reason="looks slow")
    run_tick("g1", now=t0 + 1.5)
    p.refresh_from_db()
    assert p.outcome == "failed" and "no longer pending_approval" in p.outcome_reason
    assert Node.objects.get(pk=node.pk).state == "healthy"
    # The dashboard says so.
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("viewer1", password="pw-12345-long")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client.force_login(user)
    page = client.get("/approvals/").content.decode()
    assert "<strong class=\"failed\">failed</strong>: node is healthy, no longer pending_approval" in page
    override = do_quarantine(node, actor="alice", reason="x")
    Override.objects.filter(pk=override.pk).update(applied_at=p.applied_at, outcome="failed",
                                                   outcome_reason="illegal edge")
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert "<strong class=\"failed\">failed</strong>: illegal edge" in page
