"""Issue 26 item 1: the threshold preview checks that its replay of the **current** thresholds
reproduces the cuts and quarantines the detector recorded, and says how far off it is where it does
not, instead of showing "no difference"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from outlier_admin.control.models import Transition
from outlier_admin.history.preview import WHY_BETWEEN_ROWS, preview_thresholds

pytestmark = pytest.mark.django_db


def test_a_recorded_quarantine_is_reproduced_by_the_current_threshold_replay(fleet, redis_client):
    """The fixture's node 0 was cut, then quarantined (its history: Z 0.5, then 4.2 at 2x)."""
    f = preview_thresholds(fleet["group"], {"quarantine_z": 5.0}, window_s=3600).fidelity
    assert f is not None and f.faithful, f
    assert (f.recorded, f.reproduced) == (2, 2)


def test_a_recorded_quarantine_the_replay_misses_is_said_not_hidden(fleet, users, redis_client):
    """Node 3's history shows a healthy node (Z 0.1 throughout), yet a quarantine was recorded (as the
    demo's a100-02 was, between two history rows): the preview names it and does not claim 'no
    difference'."""
    group, nodes, now = fleet["group"], fleet["nodes"], fleet["now"]
    Transition.objects.create(group=group, node=nodes[3], at=now - timedelta(minutes=5), from_state="healthy",
                              to_state="pending_approval", reason="z_quarantine", signal="norm", z=12.2,
                              explanation={})
    f = preview_thresholds(group, {"quarantine_z": 5.0}, window_s=3600).fidelity
    assert not f.faithful and (f.recorded, f.reproduced) == (3, 2)
    assert f.missed == [(nodes[3].name, "quarantine")] and f.extra == []
    body = f.to_dict()
    assert body["faithful"] is False and body["missed"] == [
        {"node": nodes[3].name, "to_state": "quarantine", "why": WHY_BETWEEN_ROWS["quarantine"]}]

    c = Client()
    c.force_login(users["operator"])
    html = c.post(f"/groups/{group.slug}/thresholds/", {"quarantine_z": "5", "preview": "1"}).content.decode()
    warning = html.split('id="fidelity"')[1].split("</div>")[0]
    assert "does not reproduce what happened" in warning and "2 of the 3" in warning
    assert f"recorded, not replayed: {nodes[3].name} → quarantine: its recorded figures are under" in warning
    # The difference comes after the check of what the replay reproduces.
    assert html.index('id="fidelity"') < html.index("no longer happening")
