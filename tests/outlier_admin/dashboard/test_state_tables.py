"""The dashboard's and the API's state tables are built from ``detector.states`` and cover every
state exactly once: a state added to the detector without an icon, a colour or a place in the
display orders fails here, not on a page."""

from __future__ import annotations

from detector.states import NodeState
from outlier_admin.dashboard.heatmap import STATE_COLORS
from outlier_admin.dashboard.tables import STATE_ICONS
from outlier_admin.dashboard.templatetags.dashboard_text import state_icon
from outlier_admin.history.queries import ATTENTION_ORDER, STATE_ORDER

LABELS = sorted(s.label for s in NodeState)


def test_every_state_is_in_each_display_order_once():
    assert sorted(STATE_ORDER) == LABELS and sorted(ATTENTION_ORDER) == LABELS


def test_every_state_has_a_colour_and_every_non_warming_state_an_icon():
    assert sorted(STATE_COLORS) == LABELS
    assert sorted(STATE_ICONS) == sorted(set(LABELS) - {NodeState.WARMING.label})
    assert state_icon(NodeState.QUARANTINED.label) == "✖" and state_icon("no_such_state") == "○"
