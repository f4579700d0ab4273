"""The audit log is append-only from the application: no update, no delete, by instance or queryset."""

from __future__ import annotations

import pytest

from outlier_admin.control.actions import do_create_group
from outlier_admin.control.models import AuditEvent, AuditLogIsAppendOnly

pytestmark = pytest.mark.django_db


def test_events_are_written_and_never_changed_or_removed():
    do_create_group("g1", actor="alice", reason="new fleet")
    event = AuditEvent.objects.get(actor="alice")
    original = (event.action, event.reason, event.at)

    event.reason = "rewritten history"
    with pytest.raises(AuditLogIsAppendOnly):
        event.save()
    with pytest.raises(AuditLogIsAppendOnly):
        event.delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.filter(pk=event.pk).update(reason="x")
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.all().delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.filter(actor="alice").delete()

    stored = AuditEvent.objects.get(pk=event.pk)
    assert (stored.action, stored.reason, stored.at) == original
    # Appending still works, through the manager and through save() of a new instance.
    AuditEvent.objects.create(actor="bob", action="test.append", reason="one more")
    AuditEvent(actor="carol", action="test.append").save()
    assert AuditEvent.objects.filter(action="test.append").count() == 2


def test_deleting_a_group_keeps_its_audit_trail():
    from outlier_admin.fleet.models import ModelGroup

    group = do_create_group("g2", actor="alice", reason="temporary")
    events = AuditEvent.objects.filter(group=group).count()
    assert events >= 1
    group.delete()  # the foreign key is SET_NULL by the database layer; the event text stays
    assert AuditEvent.objects.filter(actor="alice", group__isnull=True).count() == events
    assert not ModelGroup.objects.filter(name="g2").exists()
