"""Incidents (issue 35): one per episode out of full service, opened and closed by the writer of the
transitions (``control.rows.write_rows``, both its PostgreSQL statement and the ORM path of the demo's
SQLite), with one start and one deciding cause however many canary cycles run beneath it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from outlier_admin.control.actions import do_register_node, do_retire_node
from outlier_admin.control.incidents import cause_text, probe_summary, story
from outlier_admin.control.models import CanaryProbe, Incident, IncidentOutcome
from outlier_admin.control.models import Transition as Row
from outlier_admin.control.rows import TickRows, write_rows

T0 = datetime(2026, 12, 6, 13, 9, 19, tzinfo=UTC)


@pytest.fixture(params=["postgresql", "orm"])
def path(request, monkeypatch):
    if request.param == "orm":  # the demo's SQLite path, on this database
        from django.db import connection

        monkeypatch.setattr(type(connection), "vendor", "sqlite", raising=False)
    return request.param


def _write(group, node, edges, start=T0):
    """Write ``edges`` (``(seconds after start, from, to, reason, extra)``) one tick each, as the tick does."""
    for k, (s, frm, to, reason, extra) in enumerate(edges):
        row = Row(group=group, node=node, at=start + timedelta(seconds=s), from_state=frm, to_state=to,
                  reason=reason, explanation={"detail": extra.pop("detail", "")}, **extra)
        write_rows(group, 100 + k + int(s), TickRows(transitions=[row]))


THROTTLED = [
    (0, "healthy", "degraded", "z_degrade",
     {"signal": "decode", "z": 18.4, "ema": 30.87, "baseline": 16.07, "detail": "evidence 5.3 sd"}),
    (1, "degraded", "quarantined", "z_quarantine", {"signal": "decode", "z": 22.6, "ema": 34.1, "baseline": 16.0}),
    (11, "quarantined", "probing", "probe_due", {}),
    (22, "probing", "quarantined", "probe_failed", {"detail": "probe 2.95x expected, limit 1.50x expected"}),
    (22, "quarantined", "probing", "probe_due", {}),
    (33, "probing", "quarantined", "probe_failed", {}),
    (33, "quarantined", "probing", "probe_due", {}),
    (44, "probing", "quarantined", "probe_failed", {}),
]


@pytest.mark.django_db
def test_one_incident_through_three_probe_cycles_keeps_its_start_and_cause(make_group, path):
    group = make_group("inc-g")
    node = do_register_node(group, "127.0.0.1:9001", actor="test")
    _write(group, node, [(s, f, t, r, dict(x)) for s, f, t, r, x in THROTTLED])
    inc = Incident.objects.get()
    assert inc.is_open and inc.started_at == T0 and inc.opened_by.reason == "z_degrade"
    assert (inc.signal, inc.z, inc.unit, inc.probes_failed) == ("decode", 18.4, "ms/token", 3)
    assert (inc.first_state, inc.worst_state, inc.quarantined_at) == ("degraded", "quarantined", T0 + timedelta(seconds=1))
    assert cause_text(inc) == ("slower than its peers on decode time per token: Z 18.4, "
                               "EMA 30.9 ms/token vs peer baseline 16.1 ms/token (1.92x)")
    # Healed: its probes pass, its restore ends the incident; a probe failed, so the fault was confirmed.
    _write(group, node, [(55, "quarantined", "probing", "probe_due", {}),
                         (66, "probing", "recovering", "probes_passed", {}),
                         (90, "recovering", "healthy", "recovered", {})])
    inc.refresh_from_db()
    assert not inc.is_open and inc.ended_at == T0 + timedelta(seconds=90)
    assert inc.outcome == IncidentOutcome.FAULT_CONFIRMED and inc.closed_by.reason == "recovered"
    assert Incident.objects.count() == 1
    told = story(inc)
    assert told.cycles == 7  # the probe_due / probe_failed edges: probe outcomes, not steps
    assert [row.reason for _, kind, row in told.steps if kind == "transition"] == [
        "z_degrade", "z_quarantine", "probes_passed", "recovered"]


@pytest.mark.django_db
def test_a_cut_that_recovers_without_a_failed_probe_is_no_fault_found(make_group, path):
    group = make_group("inc-g")
    node = do_register_node(group, "127.0.0.1:9002", actor="test")
    _write(group, node, [(0, "healthy", "degraded", "z_degrade",
                          {"signal": "prefill_time", "z": 3.1, "ema": 1.71, "baseline": 0.93}),
                         (53, "degraded", "healthy", "z_recovered", {"signal": "prefill_time"})])
    inc = Incident.objects.get()
    assert inc.outcome == IncidentOutcome.NO_FAULT_FOUND and inc.get_outcome_display() == \
        "cut and restored: no fault found"
    assert "prefill time: Z 3.1, EMA 1.71x expected vs peer baseline 0.93x expected (1.84x)" in cause_text(inc)
    # A second cut later is a second incident.
    _write(group, node, [(0, "healthy", "degraded", "z_degrade", {"signal": "decode", "z": 2.5})],
           start=T0 + timedelta(minutes=5))
    assert Incident.objects.count() == 2 and Incident.objects.filter(ended_at__isnull=True).count() == 1


@pytest.mark.django_db
def test_an_operator_release_and_a_retirement_end_an_incident_as_theirs(make_group, path):
    group = make_group("inc-g")
    a = do_register_node(group, "127.0.0.1:9003", actor="test")
    b = do_register_node(group, "127.0.0.1:9004", actor="test")
    _write(group, a, [(0, "healthy", "forced_quarantine", "operator_quarantine", {}),
                      (30, "forced_quarantine", "healthy", "operator_release", {})])
    assert Incident.objects.get(node=a).outcome == IncidentOutcome.OPERATOR
    _write(group, b, [(0, "healthy", "quarantined", "z_quarantine", {"signal": "norm", "z": 9.0})])
    do_retire_node(b, actor="test", reason="broken GPU, replaced")
    inc = Incident.objects.get(node=b)
    assert inc.outcome == IncidentOutcome.RETIRED and inc.ended_at is not None


@pytest.mark.django_db
def test_a_shadow_transition_opens_no_incident_and_a_node_out_before_incidents_is_traced_back(make_group):
    group = make_group("inc-g")
    node = do_register_node(group, "127.0.0.1:9005", actor="test")
    write_rows(group, 1, TickRows(transitions=[Row(group=group, node=node, at=T0, from_state="healthy",
                                                   to_state="degraded", reason="z_degrade", shadow=True)]))
    assert not Incident.objects.exists()
    # A node quarantined before incidents existed: its next probe cycle opens one at the old cut.
    Row.objects.create(group=group, node=node, at=T0 + timedelta(seconds=5), from_state="healthy",
                       to_state="quarantined", reason="z_quarantine", signal="decode", z=12.0)
    _write(group, node, [(10, "quarantined", "probing", "probe_due", {})])
    inc = Incident.objects.get()
    assert inc.started_at == T0 + timedelta(seconds=5) and inc.reason == "z_quarantine" and inc.signal == "decode"


def test_the_probe_line_counts_the_probes_and_states_the_last_one_with_its_limit():
    now = T0 + timedelta(seconds=60)
    probes = [CanaryProbe(at=now - timedelta(seconds=11), ok=True, passed=False, normalised_latency=2.7, limit=1.4),
              CanaryProbe(at=now - timedelta(seconds=24), ok=True, passed=False, normalised_latency=2.9, limit=1.4),
              CanaryProbe(at=now - timedelta(seconds=37), ok=False, status=0, error="timeout", passed=False)]
    assert probe_summary(probes, now) == "3 probes failed, last 11 s ago: 2.70x expected, limit 1.40x expected"
    assert probe_summary(probes[2:], now) == "1 probe failed, last 37 s ago: no answer (timeout)"
    assert probe_summary([], now) == ""
