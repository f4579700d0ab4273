"""Formatting of the nodes table rows (must print what the template filters printed before)."""

from __future__ import annotations

import pytest
from django.template.defaultfilters import floatformat
from hypothesis import given
from hypothesis import strategies as st

from outlier_admin.dashboard.tables import STATE_ICONS, fixed, gpu_flags


@pytest.mark.parametrize("value", [4.2, 1.0005, 0.9994999, -1.23456, 123456.789, 0.0, 2.675, -0.0004, 1e-7, 3.14159e5])
@pytest.mark.parametrize("places", [2, 3])
def test_fixed_matches_django_floatformat(value, places):
    assert fixed(value, places) == str(floatformat(value, places))


def test_fixed_missing_is_a_dash():
    assert fixed(None, 3) == "–"


def test_gpu_flags_faults_before_throttle_and_nothing_for_clean_gpus():
    evidence = {"gpus": {"0": {"faults": ["xid_79", "ecc_dbe"]}, "1": {"throttle": True}, "2": {}}}
    assert gpu_flags(evidence) == ["⚑ GPU 0: xid_79, ecc_dbe", "⚠ GPU 1 throttled"]
    assert gpu_flags({}) == gpu_flags(None) == []


def test_every_state_has_a_glyph_so_colour_is_not_the_only_cue():
    from outlier_admin.history.queries import STATE_ORDER

    assert {s for s in STATE_ORDER if s != "warming"} <= set(STATE_ICONS)


# Below ~1e-100 floatformat gives up and returns the number unformatted ("7.47e-184"); we print
# "0.00" there, so the property covers the magnitudes a latency figure or Z can have.
@given(st.floats(min_value=-1e9, max_value=1e9).filter(lambda v: v == 0 or abs(v) >= 1e-12), st.sampled_from([2, 3]))
def test_fixed_matches_floatformat_for_any_figure(value, places):
    assert fixed(value, places) == str(floatformat(value, places))
