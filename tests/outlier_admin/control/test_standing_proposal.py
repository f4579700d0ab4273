"""Issue 26 item 3: under a lasting fault, a detector proposal stands. The demo's PCIe-degraded node under
the ``approval`` policy got four proposals, three ``superseded``: between them it went back to
``healthy`` at weight 100 whenever its Z dipped (at the floor weight its smaller batch reads faster).
Through the real tick (PostgreSQL, Redis): the node is held ``pending_approval`` while its dips are
shorter than ``degrade_exit_dwell_s``, its one proposal stays pending (nothing superseded, nothing
re-opened), and an operator's approval of it still quarantines the node."""

from __future__ import annotations

import time

import numpy as np
import pytest

from detector.thresholds import Thresholds
from harness.records import make_records
from outlier_admin.control.actions import do_approve_proposal
from outlier_admin.control.models import QuarantineProposal, Transition
from outlier_admin.control.tick import run_tick
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]
SLOW = "127.0.0.1:9003"


def _tick(t0: float, k: int, rng: np.random.Generator, slowdown: float) -> str:
    recs = make_records(t0 + k, rng=rng, slow={3: slowdown})
    assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
    return run_tick("g1", now=t0 + k + 0.5).states[SLOW]


def test_a_lasting_fault_keeps_its_one_proposal_through_its_dips(redis_client, make_group):
    make_group("g1", policy="approval")
    rng, t0 = np.random.default_rng(11), time.time()
    dwell = Thresholds().degrade_exit_dwell_s
    k, states = 0, []
    while _tick(t0, k, rng, 3.0) != "pending_approval":
        k += 1
        assert k < 30, "never proposed"
    first = QuarantineProposal.objects.get(node__name=SLOW, status="pending")
    # The demo's sequence, one tick a second: slow, a dip back to its peers' speed shorter than the
    # dwell, slow again, a second dip; twice.
    for slowdown, seconds in [(3.0, 5), (1.0, int(dwell) - 12), (3.0, 5), (1.0, int(dwell) - 8)] * 2:
        for _ in range(seconds):
            k += 1
            states.append(_tick(t0, k, rng, slowdown))
    assert set(states) == {"pending_approval"}, states
    assert list(QuarantineProposal.objects.filter(node__name=SLOW).values_list("pk", "status")) == [
        (first.pk, "pending")]
    assert not Transition.objects.filter(node__name=SLOW, to_state="healthy").exists()
    do_approve_proposal(first, actor="alice", reason="PCIe link at x4: confirmed")
    assert _tick(t0, k + 1, rng, 3.0) == "quarantined"
