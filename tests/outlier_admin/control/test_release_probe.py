"""A held cut's release probe through the whole control plane: the tick lists it, the canary worker
probes the node's real address, the next tick judges the answer and gives the cut back step by step
(``detector.ejection.probes_due``; ``detector.operator.NodeActions.record_probe``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from contract import keys
from harness.records import http_server, make_records
from outlier_admin.control.canary import run_due_probes
from outlier_admin.control.models import CanaryProbe
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.pipeline import submit
from tests.outlier_admin.control.test_canary import FakeVLLM

pytestmark = [pytest.mark.django_db, pytest.mark.services]

HELD = "127.0.0.1:9003"


def feed(t: float, rng, *, slow=None, silent=False):
    recs = make_records(t, rng=rng, slow=slow)
    if silent:  # cut to the floor weight in a quiet group: none of its requests this second
        recs = [r for r in recs if r["node"] != HELD]
    submit([(i, r, None) for i, r in enumerate(recs)], source="t")


def test_a_held_cut_is_given_back_after_a_release_probe_at_its_real_address(redis_client, make_group):
    make_group("g1")
    rng = np.random.default_rng(11)
    t0 = time.time()
    k = 0
    for k in range(40):  # healthy, then node 3 at 1.3x: cut, under the quarantine line (1.5x)
        feed(t0 + k, rng, slow={3: 1.3} if k >= 6 else None)
        res = run_tick("g1", now=t0 + k + 0.5)
        if res.states[HELD] == "degraded":
            break
    assert res.states[HELD] == "degraded"
    cut_at = k
    for k in range(cut_at + 1, cut_at + 60):  # back to speed, but silent: nothing of its own to clear it
        feed(t0 + k, rng, silent=True)
        res = run_tick("g1", now=t0 + k + 0.5)
        assert res.states[HELD] == "degraded"
        if redis_client.hexists(keys.probes("g1"), HELD):
            break
    assert redis_client.hexists(keys.probes("g1"), HELD)
    assert k - cut_at >= 30 - 1  # the exit dwell (30 s) after the cut, not before
    FakeVLLM.delay_s, FakeVLLM.status, FakeVLLM.bodies = 0.0, 200, []
    with http_server(FakeVLLM) as url:
        Node.objects.filter(name=HELD).update(address=url.removeprefix("http://"))
        assert run_due_probes() == 1
    assert len(FakeVLLM.bodies) >= 1
    feed(t0 + k + 1, rng, silent=True)
    res = run_tick("g1", now=t0 + k + 1.5)
    assert res.states[HELD] == "recovering"
    probe = CanaryProbe.objects.get(node__name=HELD)
    assert probe.passed is True and probe.limit is not None and probe.normalised_latency < probe.limit
