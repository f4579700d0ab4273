"""The threshold preview replays history through the detector's own evaluation
(detector.evaluation.evaluate): a quarantine a real tick recorded is reproduced by the replay of the
current thresholds, and the replay of a change the tick never saw differs from it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import numpy as np
import pytest

from harness.records import make_records
from outlier_admin.api.preview import preview_thresholds
from outlier_admin.control.models import Transition
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def test_a_quarantine_recorded_by_a_tick_is_reproduced_by_the_current_threshold_replay(redis_client, settings,
                                                                                      make_group):
    make_group("g1", policy="approval")
    settings.HISTORY_EVERY_S = 1  # a history write at every tick, as the replay's steps
    rng = np.random.default_rng(11)
    t0 = time.time()
    for k in range(10):
        recs = make_records(t0 + k, rng=rng, slow={2: 3.0} if k >= 2 else {})
        submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
        run_tick("g1", now=t0 + k + 0.5)
    recorded = list(Transition.objects.filter(group__name="g1").values_list("node__name", "to_state", "reason"))
    assert ("127.0.0.1:9002", "pending_approval", "z_quarantine") in recorded

    group = ModelGroup.objects.get(name="g1")
    end = datetime.fromtimestamp(t0 + 11, tz=UTC)
    p = preview_thresholds(group, {"quarantine_z": 100.0}, window_s=60, now=end)
    assert p.signal == group.decision_signal
    f = p.fidelity
    assert f.faithful and f.reproduced == f.recorded >= 1, f
    assert ("127.0.0.1:9002", "pending_approval") in {(t.node, t.to_state) for t in p.current}
    # A quarantine line no node reaches: the replay proposes no quarantine.
    assert not [t for t in p.proposed if t.to_state == "pending_approval"]
