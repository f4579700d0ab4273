"""Issue 16 item 5: role grants in the Django admin, ``tail_logs --add`` and the demo's re-run (un-retiring
its nodes) go through audited actions like every other change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from outlier_admin.control.actions import (
    ActionError,
    do_create_group,
    do_register_node,
    do_retire_node,
    do_set_roles,
    do_unretire_node,
)
from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import Node, ThresholdChange
from outlier_admin.ingest.models import IngestSource

pytestmark = pytest.mark.django_db


@pytest.fixture
def roles():
    return {name: Group.objects.get_or_create(name=name)[0] for name in ("viewer", "operator", "oncall")}


def test_admin_role_change_is_audited_as_the_admin(client, django_user_model, roles):
    admin_user = django_user_model.objects.create_superuser("root", password="pw-root-12345")
    carol = django_user_model.objects.create_user("carol", password="pw-carol-12345")
    do_set_roles(carol, ["viewer"], actor="test", reason="setup")
    other = Group.objects.create(name="not-a-role")
    client.force_login(admin_user)
    form = {
        "username": "carol", "is_active": "on", "groups": [roles["operator"].pk, roles["oncall"].pk, other.pk],
        "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00", "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    resp = client.post(f"/admin/auth/user/{carol.pk}/change/", form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert set(carol.groups.values_list("name", flat=True)) == {"operator", "oncall", "not-a-role"}
    event = AuditEvent.objects.filter(action="user.roles").latest("pk")
    assert (event.actor, event.detail) == ("root", {"username": "carol", "old": ["viewer"],
                                                    "new": ["oncall", "operator"]})
    # Saving again without a role change writes nothing.
    client.post(f"/admin/auth/user/{carol.pk}/change/", form)
    assert AuditEvent.objects.filter(action="user.roles", actor="root").count() == 1


def test_set_roles_refuses_unknown_roles(django_user_model, roles):
    u = django_user_model.objects.create_user("dave")
    with pytest.raises(ActionError, match="roles must be some of"):
        do_set_roles(u, ["viewer", "superuser"], actor="test", reason="x")
    assert not u.groups.exists()


def test_tail_logs_add_is_audited(tmp_path):
    group = do_create_group("logs-g", actor="test")
    log = tmp_path / "access.log"
    log.write_text("")
    call_command("tail_logs", "--add", "edge-1", "--path", str(log), "--format", "jsonl", "--group", "logs-g",
                 "--once")
    created = AuditEvent.objects.get(action="ingest_source.create")
    assert (created.actor, created.group_id, created.detail["path"]) == ("cli:tail_logs", group.pk, str(log))
    other = tmp_path / "other.log"
    other.write_text("")
    call_command("tail_logs", "--add", "edge-1", "--path", str(other), "--format", "jsonl", "--once")
    updated = AuditEvent.objects.get(action="ingest_source.update")
    assert updated.detail["diff"] == {"location": [str(log), str(other)], "default_group": ["logs-g", None]}
    assert IngestSource.objects.get(name="edge-1").location == str(other)


def test_unretire_is_audited_and_refused_twice():
    group = do_create_group("u-g", actor="test")
    node = do_register_node(group, "127.0.0.1:8000", actor="test")
    do_retire_node(node, actor="test", reason="gone")
    do_unretire_node(node, actor="alice", reason="back from repair")
    assert not Node.objects.get(pk=node.pk).retired
    assert AuditEvent.objects.filter(action="node.unretire", actor="alice").count() == 1
    with pytest.raises(ActionError, match="not retired"):
        do_unretire_node(node, actor="alice", reason="again")


def test_demo_rerun_unretires_and_moves_its_nodes_through_actions(roles):
    from outlier_admin.demo.fleet import LARGE, node_name
    from outlier_admin.demo.runner import ACTOR, seed

    addresses = {(g, i): f"127.0.{g + 1}.{i + 1}:8000" for g in (0, 1) for i in range(32)}
    seed(SimpleNamespace(small_policy="approval", canary_interval_s=None), addresses, "pw-demo-12345")
    node = Node.objects.get(group__name=LARGE, name=node_name(0, 3))
    do_retire_node(node, actor="test", reason="simulated loss")
    moved = {**addresses, (0, 4): "127.0.9.9:8000"}
    seed(SimpleNamespace(small_policy="approval", canary_interval_s=None), moved, "pw-demo-12345")
    assert not Node.objects.get(pk=node.pk).retired
    assert Node.objects.get(group__name=LARGE, name=node_name(0, 4)).address == "127.0.9.9:8000"
    by_action = {a: AuditEvent.objects.filter(action=a, actor=ACTOR).count()
                 for a in ("node.unretire", "node.update", "user.roles")}
    assert by_action == {"node.unretire": 1, "node.update": 1, "user.roles": 1}
    assert not ThresholdChange.objects.exists()  # DEMO_CANARY_INTERVAL_S unset: the groups' own


def test_demo_canary_interval_is_a_threshold_change_of_both_groups_once(roles):
    from outlier_admin.demo.fleet import LARGE, SMALL
    from outlier_admin.demo.runner import ACTOR, seed

    addresses = {(g, i): f"127.0.{g + 1}.{i + 1}:8000" for g in (0, 1) for i in range(32)}
    cfg = SimpleNamespace(small_policy="approval", canary_interval_s=2.0)
    groups = seed(cfg, addresses, "pw-demo-12345")
    assert [g.thresholds().canary_interval_s for g in groups] == [2.0, 2.0]
    seed(cfg, addresses, "pw-demo-12345")  # a re-run with the same value changes nothing
    changes = ThresholdChange.objects.filter(actor=ACTOR).order_by("group__name")
    assert [(c.group.name, c.diff) for c in changes] == sorted(
        (name, {"canary_interval_s": [10.0, 2.0]}) for name in (LARGE, SMALL))
