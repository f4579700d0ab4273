"""Action functions: change + audit in one transaction, validation with clear errors."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from detector.thresholds import ThresholdError
from outlier_admin.control.actions import (
    ActionError,
    do_approve_proposal,
    do_create_group,
    do_pin_weight,
    do_propose_quarantine,
    do_quarantine,
    do_register_node,
    do_reject_proposal,
    do_update_thresholds,
)
from outlier_admin.control.models import AuditEvent, Override
from outlier_admin.fleet.models import ThresholdChange

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    group = do_create_group("g", actor="setup")
    return do_register_node(group, "127.0.0.1:8000", actor="setup")


def test_roles_exist():
    assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "operator", "oncall"}


def test_quarantine_writes_override_and_audit(node):
    user = User.objects.create(username="alice")
    o = do_quarantine(node, actor=user, reason="ECC storm", expires_in_s=600)
    assert o.kind == "quarantine" and o.applied_at is None and o.expires_at is not None
    ev = AuditEvent.objects.get(action="node.quarantine")
    assert (ev.actor, ev.user, ev.node, ev.reason) == ("alice", user, node, "ECC storm")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"reason": " "}, "reason is required"), ({"reason": "x", "expires_in_s": -5}, "expires_in_s")],
)
def test_quarantine_refuses_bad_input_and_writes_nothing(node, kwargs, message):
    with pytest.raises(ActionError, match=message):
        do_quarantine(node, actor="bob", **kwargs)
    assert not Override.objects.exists() and not AuditEvent.objects.filter(action="node.quarantine").exists()


def test_pin_weight_range(node):
    with pytest.raises(ActionError, match=r"\[0, 100\]"):
        do_pin_weight(node, 101, actor="bob", reason="x")
    assert do_pin_weight(node, 10, actor="bob", reason="half traffic").weight == 10


def test_threshold_update_versions_and_diff(node):
    group = node.group
    change = do_update_thresholds(group, {"quarantine_z": 4.0}, actor="carol", reason="too eager")
    assert change.version == 2 and change.diff == {"quarantine_z": [3.5, 4.0]}
    group.refresh_from_db()
    assert group.thresholds().quarantine_z == 4.0 and group.threshold_overrides == {"quarantine_z": 4.0}
    with pytest.raises(ThresholdError) as err:
        do_update_thresholds(group, {"quarantine_z": 1.0}, actor="carol", reason="oops")
    assert err.value.field == "quarantine_z"
    with pytest.raises(ThresholdError):
        do_update_thresholds(group, {"no_such": 1}, actor="carol", reason="typo")
    assert ThresholdChange.objects.filter(group=group).count() == 1


def test_proposal_decided_once(node):
    p = do_propose_quarantine(node, actor="system:dcgm", source="gpu_fault", reason="XID 79")
    assert do_propose_quarantine(node, actor="system:dcgm", source="gpu_fault", reason="XID 79").pk == p.pk
    do_approve_proposal(p, actor="dave", reason="confirmed")
    with pytest.raises(ActionError, match="already approved"):
        do_reject_proposal(p, actor="erin", reason="no")
    assert AuditEvent.objects.filter(action="proposal.approved", actor="dave").exists()
