"""Runs ``python -m outlier_admin.demo`` for 18 s with a short fault schedule (the one slow test of
this area): a node must be degraded or quarantined, and the web endpoints must answer meanwhile."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from contract import keys
from harness.gateways import free_low_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_degrades_and_quarantines_the_throttled_node(tmp_path, settings, redis_client):
    port = free_low_port()
    db = tmp_path / "demo.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "REDIS_URL": settings.REDIS_URL, "PORT": str(port),
           "DEMO_SECONDS": "18", "DEMO_FAULT_AT_S": "3", "DEMO_PCIE_AT_S": "3", "DEMO_HEAL_AT_S": "12",
           "DEMO_TICK_S": "0.5", "DEMO_PASSWORD": "test-only"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # A colleague's control plane on the same Redis database: the demo runs beside it, leaves its keys alone.
    theirs = {keys.weights("team-llm"): b'{"group": "team-llm"}', keys.state("team-llm"): b"state"}
    redis_client.mset(theirs)
    proc = subprocess.Popen([sys.executable, "-m", "outlier_admin.demo"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    answered = {}
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and len(answered) < 3:
            for path in ("/healthz", "/readyz", "/metrics"):
                if path in answered:
                    continue
                try:
                    resp = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
                except httpx.HTTPError:
                    continue
                if resp.status_code == 200 and (path != "/metrics" or "outlier_node_weight" in resp.text):
                    answered[path] = resp.text
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert set(answered) == {"/healthz", "/readyz", "/metrics"}, out
    assert f"Redis at {settings.REDIS_URL}" in out
    assert "also holds 1 other group(s) (team-llm)" in out, out
    assert dict(zip(theirs, redis_client.mget(list(theirs)), strict=True)) == theirs
    assert "login: demo / test-only" in out
    # The printed API token is a real api-scope token of the demo user, and the database is named
    # so that manage.py commands can be pointed at it.
    token = re.search(r"api token: (oa_\S+)", out).group(1)
    assert f"manage.py: DATABASE_URL=sqlite:///{db} DJANGO_DEBUG=1 python manage.py" in out
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            "SELECT t.scope, u.username FROM fleet_apitoken t JOIN auth_user u ON u.id = t.user_id "
            "WHERE t.token_hash = ?", (hashlib.sha256(token.encode()).hexdigest(),)).fetchall() == [("api", "demo")]
        rows = conn.execute(
            "SELECT n.name, t.to_state FROM control_transition t JOIN fleet_node n ON n.id = t.node_id "
            "WHERE t.to_state IN ('degraded', 'quarantined', 'pending_approval')").fetchall()
        records = conn.execute("SELECT count(*) FROM control_nodehistory").fetchone()[0]
    hit = {name for name, _ in rows}
    assert "h100-05" in hit, out  # the thermally throttled node
    assert records > 0
    assert "demo finished" in out
    scrapes = re.search(r"(\d+) streamed-progress rows", out)
    assert scrapes and int(scrapes.group(1)) > 0, out  # every node's /metrics fed the streamed signal
