"""The tick stores what the detector decided (issue 27): each node's deciding signal on its history
rows and the group's deciding signal and safeguard figures on its row, from the detector's own
Evaluation; the API and the dashboard read them instead of deriving them again."""

from __future__ import annotations

import time

import numpy as np
import pytest
from rest_framework.test import APIClient

from detector.states import SAFEGUARD_COUNTED, Safeguard
from harness.records import make_records
from outlier_admin.control.models import NodeHistory, Transition
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]

COUNTED = {s.label for s in SAFEGUARD_COUNTED}


def test_the_tick_stores_each_nodes_deciding_signal_and_the_groups_safeguard(redis_client, settings, make_group,
                                                                             django_user_model):
    make_group("g1", policy="approval")
    settings.HISTORY_EVERY_S = 1  # every tick below writes every node's history
    rng = np.random.default_rng(11)
    t0 = time.time()
    for k in range(8):
        recs = make_records(t0 + k, rng=rng, slow={2: 3.0})
        submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
        run_tick("g1", now=t0 + k + 0.5)

    # The gray node was proposed for quarantine on the signal its transition names, and that write's
    # history flags the same signal as the one it was judged on.
    proposed = Transition.objects.get(node__name="127.0.0.1:9002", to_state="pending_approval")
    flagged = NodeHistory.objects.filter(node=proposed.node, at=proposed.at, deciding=True)
    assert [h.signal for h in flagged] == [proposed.signal] and proposed.signal
    assert flagged.get().z == pytest.approx(proposed.z)
    # At most one deciding row per node and write, and only on a row with a Z.
    last = NodeHistory.objects.filter(node__group__name="g1").latest("at").at
    rows = NodeHistory.objects.filter(node__group__name="g1", at=last)
    assert all(rows.filter(node=n, deciding=True).count() <= 1 for n in {r.node for r in rows})
    assert not rows.filter(deciding=True, z__isnull=True).exists()

    group = ModelGroup.objects.get(name="g1")
    states = list(group.nodes.values_list("state", flat=True))
    # 30 % of 8 nodes is 2; the pending proposal counts against it (the ejection layer's rule).
    assert group.safeguard() == Safeguard(limit=2, counted=sum(s in COUNTED for s in states), held=0)
    assert "pending_approval" in states and group.safeguard().counted >= 1
    assert group.decision_signal == proposed.signal

    # The API reads the stored figures: the group's safeguard, each node's signal.
    user = django_user_model.objects.create_user("reader")
    from django.contrib.auth.models import Group as Role

    user.groups.add(Role.objects.get(name="viewer"))
    c = APIClient()
    c.force_authenticate(user)
    body = c.get(f"/api/v1/groups/{group.slug}/").json()
    assert body["decision_signal"] == proposed.signal
    assert body["safeguard"] == {"limit": 2, "counted": group.safeguard_counted, "held": 0,
                                 "engaged": group.safeguard().engaged}
    node = c.get(f"/api/v1/nodes/{proposed.node.pk}/").json()
    latest = NodeHistory.objects.filter(node=proposed.node).latest("at").at
    deciding = NodeHistory.objects.filter(node=proposed.node, at=latest, deciding=True).first()
    assert node["signal"] == (deciding.signal if deciding else group.decision_signal)
