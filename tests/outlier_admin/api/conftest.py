"""Fixtures shared by the API and dashboard tests: one user per role, a group with history."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from outlier_admin.control.actions import do_create_group, do_propose_quarantine, do_register_node
from outlier_admin.control.models import NodeHistory, Transition

ROLE_NAMES = ("viewer", "operator", "oncall")


def make_user(username: str, *roles: str) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username)
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # PBKDF2 costs ~0.3 s per user on a shared 2-core machine; tests do not need slow hashes.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def users(db) -> dict[str, User | None]:
    """``{"anonymous": None, "norole": ..., "viewer": ..., "operator": ..., "oncall": ...}``."""
    out: dict[str, User | None] = {"anonymous": None, "norole": make_user("norole")}
    for role in ROLE_NAMES:
        out[role] = make_user(role, role)
    return out


def write_history(node, *, start, count: int, every_s: float = 10.0, z=0.0, ema=1.0, state="healthy",
                  p50=1.0, p99=2.0):
    """``count`` norm-signal history rows for ``node``; ``z``/``ema``/``state`` may be callables of i."""
    def at(v, i):
        return v(i) if callable(v) else v

    rows = []
    for i in range(count):
        val = partial(at, i=i)
        rows.append(NodeHistory(
            node=node, signal="norm", at=start + timedelta(seconds=i * every_s), ema=val(ema), z=val(z),
            p50=val(p50), p99=val(p99), samples=100 + i, weight=0.0 if val(state) == "quarantined" else 100.0,
            state=val(state),
        ))
    NodeHistory.objects.bulk_create(rows)


@pytest.fixture
def fleet(db):
    """Group ``llama`` (policy approval) with 8 nodes; node 0 quarantined with 30 min of history,
    a pending proposal on node 1."""
    group = do_create_group("llama", actor="setup", policy="approval")
    nodes = [do_register_node(group, f"127.0.0.{i}:8000", actor="setup") for i in range(8)]
    now = timezone.now()
    start = now - timedelta(minutes=30)
    for i, node in enumerate(nodes):
        node.state = "quarantined" if i == 0 else "healthy"
        node.weight = 0 if i == 0 else 100
        node.last_seen = now
        node.save()
        if i == 0:
            write_history(node, start=start, count=180, z=lambda k: 0.5 if k < 60 else 4.2,
                          ema=lambda k: 1.0 if k < 60 else 2.0,
                          state=lambda k: "healthy" if k < 60 else "degraded" if k < 75 else "quarantined")
        else:
            write_history(node, start=start, count=180, z=0.1 * (i % 3), ema=1.0 + 0.01 * i)
    Transition.objects.create(group=group, node=nodes[0], at=start + timedelta(seconds=600), from_state="healthy",
                              to_state="degraded", reason="z_degrade", signal="norm", z=2.4, baseline=1.0,
                              ema=1.6, explanation={"detail": "Z 2.4 >= degrade_z 2.0"})
    Transition.objects.create(group=group, node=nodes[0], at=start + timedelta(seconds=750), from_state="degraded",
                              to_state="quarantined", reason="z_quarantine", signal="norm", z=4.2, baseline=1.0,
                              ema=2.0, explanation={"detail": "Z 4.2 >= quarantine_z 3.5 for 10 samples"})
    proposal = do_propose_quarantine(nodes[1], actor="system:detector", source="detector", reason="z_quarantine")
    return {"group": group, "nodes": nodes, "proposal": proposal, "now": now}
