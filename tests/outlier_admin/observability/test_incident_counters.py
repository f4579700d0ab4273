"""Issue 35: the counters count incidents, not probes. ``outlier_transitions_total{to_state=
"quarantined"}`` read 14 for one incident (every probing -> quarantined cycle counted); now the
canary's cycles are probe outcomes (``outlier_canary_cycles_total{outcome}``), and the incidents
have their own series."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.models import Transition
from outlier_admin.control.rows import TickRows, write_rows
from outlier_admin.observability import metrics
from outlier_admin.observability.events import scan_events

pytestmark = pytest.mark.django_db

GROUP = "incident-count-group"
T0 = datetime(2026, 12, 6, 13, 9, 19, tzinfo=UTC)


def _value(name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(metrics.render(fleet=True).decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_one_incident_with_three_failed_probes_counts_one_quarantine(redis_client):
    group = do_create_group(GROUP, actor="test")
    node = do_register_node(group, "127.0.4.1:8000", actor="test")
    scan_events(deliver=False)  # the first scan sets the cursors at the current rows
    before = _value("outlier_transitions_total", group=GROUP, to_state="quarantined")
    edges = [("healthy", "degraded", "z_degrade"), ("degraded", "quarantined", "z_quarantine")]
    edges += [("quarantined", "probing", "probe_due"), ("probing", "quarantined", "probe_failed")] * 3
    for k, (frm, to, reason) in enumerate(edges):
        write_rows(group, k + 1, TickRows(transitions=[Transition(
            group=group, node=node, at=T0 + timedelta(seconds=10 * k), from_state=frm, to_state=to, reason=reason,
            signal="decode" if reason.startswith("z_") else "", z=20.0 if reason.startswith("z_") else None)]))
    assert scan_events(deliver=False).transitions == 8
    assert _value("outlier_transitions_total", group=GROUP, to_state="quarantined") - before == 1
    assert _value("outlier_canary_cycles_total", group=GROUP, outcome="probe_failed") >= 3
    assert _value("outlier_canary_cycles_total", group=GROUP, outcome="probe_due") >= 3
    assert _value("outlier_incidents_total", group=GROUP) == 1
    assert _value("outlier_incidents_open", group=GROUP) == 1


def test_a_cursor_from_another_database_starts_again_at_this_ones_last_row(redis_client):
    """A second ``make demo`` (a fresh SQLite, the same Redis): the old cursor was past every new id and
    the scan counted nothing."""
    from contract import keys

    group = do_create_group(GROUP, actor="test")
    node = do_register_node(group, "127.0.4.2:8000", actor="test")
    redis_client.set(keys.OBS_PREFIX + "cursor:transition", 10**9)
    scan_events(deliver=False)
    write_rows(group, 1, TickRows(transitions=[Transition(group=group, node=node, at=T0, from_state="healthy",
                                                          to_state="degraded", reason="z_degrade")]))
    assert scan_events(deliver=False).transitions == 1


def test_a_probe_applied_without_a_verdict_is_not_pending(redis_client):
    """A confirmation probe of a degraded node, or one answered after the node left the canary's states,
    is applied without a verdict: not a probe waiting to be judged (it was counted pending for good)."""
    from django.utils import timezone

    from outlier_admin.control.models import CanaryProbe

    group = do_create_group(GROUP, actor="test")
    node = do_register_node(group, "127.0.4.3:8000", actor="test")
    CanaryProbe.objects.create(node=node, ok=True, passed=None, applied_at=timezone.now())
    CanaryProbe.objects.create(node=node, ok=True, passed=None)
    CanaryProbe.objects.create(node=node, ok=True, passed=False, limit=1.2, applied_at=timezone.now())
    assert _value("outlier_canary_probes_pending", group=GROUP) == 1
    assert _value("outlier_canary_probes_total", group=GROUP, verdict="failed") == 1
    assert _value("outlier_canary_probes_total", group=GROUP, verdict="passed") == 0
