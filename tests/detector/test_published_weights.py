"""What a gateway is told (detector.weights.published): the shadow policy's weights are the detector's
rule, not the tick's."""

from __future__ import annotations

import numpy as np

from detector.states import NodeState
from detector.weights import published

S = NodeState
STATES = np.array([S.HEALTHY, S.DEGRADED, S.QUARANTINED, S.PENDING_APPROVAL, S.FORCED_QUARANTINE, S.FORCED_ACTIVE,
                   S.RECOVERING], dtype=np.int8)
WEIGHTS = np.array([100.0, 12.5, 0.0, 5.0, 0.0, 100.0, 50.5])
BASE = np.array([100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 99.5])


def test_enforcing_policies_publish_the_detectors_weights_rounded_half_to_even():
    codes, weights, base = published(STATES, WEIGHTS, BASE, shadow=False)
    assert codes.tolist() == STATES.tolist()
    assert weights.tolist() == [100.0, 12.0, 0.0, 5.0, 0.0, 100.0, 50.0]
    assert base.tolist() == [100.0] * 7


def test_shadow_publishes_every_judged_node_healthy_at_base_and_forced_ones_as_they_are():
    codes, weights, _ = published(STATES, WEIGHTS, BASE, shadow=True)
    assert [S(c) for c in codes] == [S.HEALTHY] * 4 + [S.FORCED_QUARANTINE, S.FORCED_ACTIVE, S.HEALTHY]
    # The forced quarantine drains (0) whatever its computed weight; everything else gets its base.
    assert weights.tolist() == [100.0, 100.0, 100.0, 100.0, 0.0, 100.0, 100.0]
