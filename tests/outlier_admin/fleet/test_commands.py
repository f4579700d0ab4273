"""Operators create groups and register nodes from the command line (ingest never creates groups)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import ModelGroup, Node

pytestmark = pytest.mark.django_db


def test_create_group_register_node_and_set_auto_register():
    call_command("create_group", "llama-70b", "--policy", "approval", "--auto-register", "127.0.0.0/24")
    group = ModelGroup.objects.get(name="llama-70b")
    assert (group.policy, group.auto_register_allow) == ("approval", ["127.0.0.0/24"])
    call_command("register_node", "llama-70b", "127.0.0.1:8000", "--metrics-url", "http://127.0.0.1:8000/metrics")
    assert Node.objects.get(name="127.0.0.1:8000").metrics_url == "http://127.0.0.1:8000/metrics"
    call_command("create_group", "llama-70b", "--auto-register", "pool-a.test")
    group.refresh_from_db()
    assert group.auto_register_allow == ["pool-a.test"]
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "group.create", "node.register", "group.auto_register"]


@pytest.mark.parametrize(("args", "message"), [
    (["register_node", "nope", "127.0.0.1:8000"], "no group"),
    (["register_node", "g", "http://127.0.0.1:8000/admin"], "host:port only"),
    (["register_node", "g", "127.0.0.1:8000", "--metrics-url", "file:///etc/passwd"], "http"),
    (["create_group", "bad//name"], "group name"),
    (["create_group", "g2", "--auto-register", "com"], "two labels"),
])
def test_bad_input_is_a_clear_error(args, message):
    call_command("create_group", "g")
    with pytest.raises(CommandError, match=message):
        call_command(*args)


def test_create_user_with_roles_prints_a_password_once_and_is_audited(capsys):
    from django.contrib.auth import authenticate
    from django.contrib.auth.models import User

    call_command("create_user", "alice", "--role", "oncall", "--role", "viewer")
    out = capsys.readouterr()
    password = out.out.strip().splitlines()[-1]
    assert "shown only once" in out.err and len(password) >= 20
    alice = User.objects.get(username="alice")
    assert sorted(alice.groups.values_list("name", flat=True)) == ["oncall", "viewer"]
    assert authenticate(username="alice", password=password) == alice
    event = AuditEvent.objects.get(action="user.create")
    assert (event.actor, event.detail) == ("cli:create_user", {"username": "alice", "roles": ["oncall", "viewer"]})
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_user", "alice", "--role", "viewer")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("create_user", "bob", "--role", "admin")
    assert not User.objects.filter(username="bob").exists()
