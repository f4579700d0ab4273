"""The audit log folds a fleet's registrations into one entry: 40 nodes registered, then an operator's
quarantine, and the quarantine is on the first screenful, not under 40 `node.register` rows; every
registration is still there (in the folded entry, and in the CSV and the API, which do not fold)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from outlier_admin.control.actions import do_create_group, do_quarantine, do_register_node
from outlier_admin.control.models import AuditEvent
from outlier_admin.history.audit import Run, fold

pytestmark = pytest.mark.django_db


def test_registrations_are_folded_and_the_decision_after_them_is_on_top(users):
    group = do_create_group("fold", actor="setup")
    nodes = [do_register_node(group, f"127.0.1.{i}:8000", actor="setup") for i in range(40)]
    do_quarantine(nodes[3], actor="oncall-ann", reason="ECC errors on GPU 3")
    c = Client()
    c.force_login(users["viewer"])
    html = c.get("/audit/").content.decode()
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr[ >].*?</tr>", body, re.S)
    assert len(rows) <= 5, len(rows)  # the quarantine, its override record(s), one folded run, the group
    assert "ECC errors on GPU 3" in " ".join(rows[:3])
    [folded] = [r for r in rows if 'class="folded"' in r]
    assert "<code>node.register</code> × 40" in folded and "127.0.1.0:8000" in folded and "127.0.1.39:8000" in folded
    assert AuditEvent.objects.filter(action="node.register").count() == 40  # nothing dropped


def test_a_short_run_or_an_interrupted_one_is_not_folded():
    class E:
        def __init__(self, action, actor="a", group_id=1, name="n"):
            self.action, self.actor, self.group_id = action, actor, group_id
            self.node = type("N", (), {"name": name})()

    reg = [E("node.register") for _ in range(2)]
    assert fold(reg) == reg  # two are two rows
    mixed = [*[E("node.register") for _ in range(3)], E("node.update"), *[E("node.register", actor="b") for _ in range(3)]]
    out = fold(mixed)
    assert [type(x).__name__ for x in out] == ["Run", "E", "Run"] and all(len(x.events) == 3 for x in out if isinstance(x, Run))
    other_group = [E("node.register", group_id=1), E("node.register", group_id=1), E("node.register", group_id=2)]
    assert fold(other_group) == other_group
