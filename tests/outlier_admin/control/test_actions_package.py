"""Every status change is an action with its audit event: the package ``control.actions`` is the only
writer of a proposal's status (a static check over the source), and the supersession the tick makes
when a pending node's condition clears writes its ``proposal.superseded`` event with the change."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

import outlier_admin
from harness.records import make_records
from outlier_admin.control.actions import do_release
from outlier_admin.control.models import AuditEvent, QuarantineProposal
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.pipeline import submit

SLOW = "127.0.0.1:9003"
PACKAGE = Path(outlier_admin.__file__).parent
ACTIONS = PACKAGE / "control" / "actions"
#: A write of a proposal's status: an attribute set to a ProposalStatus, or an update() of the column.
STATUS_WRITE = re.compile(r"\.status\s*=\s*ProposalStatus\.|\.update\([^)]*\bstatus\s*=")


def test_only_the_actions_write_a_proposals_status():
    writers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if ACTIONS not in p.parents and "migrations" not in p.parts
                     and STATUS_WRITE.search(p.read_text()))
    assert writers == []
    assert STATUS_WRITE.search((ACTIONS / "proposals.py").read_text())  # the check finds a write


@pytest.mark.django_db
@pytest.mark.services
def test_a_superseded_proposal_has_its_audit_event(redis_client, make_group):
    make_group("g1", policy="approval")
    rng, t0 = np.random.default_rng(7), time.time()
    for k in range(40):  # node 3 three times slower until the detector proposes its quarantine
        recs = make_records(t0 + k, rng=rng, slow={3: 3.0})
        assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
        if run_tick("g1", now=t0 + k + 0.5).states[SLOW] == "pending_approval":
            break
    else:
        raise AssertionError("never pending_approval")
    # An operator releases it before deciding: the node leaves pending_approval, its proposal is moot.
    do_release(Node.objects.get(name=SLOW), actor="alice", reason="swapped the card")
    assert run_tick("g1", now=t0 + k + 1.5).states[SLOW] != "pending_approval"
    p = QuarantineProposal.objects.get(node__name=SLOW)
    assert p.status == "superseded"
    event = AuditEvent.objects.get(action="proposal.superseded")
    assert (event.actor, event.node_id, event.reason) == ("system:detector", p.node_id, p.decision_reason)
    assert event.detail == {"proposal": p.pk, "source": "detector", "transition": p.transition_id}
