"""The demo on a shared machine: a busy port stops it before it changes anything, a second demo on the
same Redis is refused, and it deletes the keys of its own two groups and no other key (a colleague's
stack, or a second demo, on that Redis lost keys: it deleted ``outlier:*demo-*`` and ``outlier:obs:*``
before it found its port taken)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from contract import keys
from outlier_admin.demo.fleet import LARGE, SMALL
from outlier_admin.demo.runner import LEASE_KEY, clear_demo_keys, own_key

ROOT = Path(__file__).resolve().parents[3]

#: A colleague's stack on the same Redis database, and the keys every group shares.
THEIRS = {
    keys.weights("team-llm"): b'{"group": "team-llm"}',
    keys.legacy_weights("team-llm"): b'{"group": "team-llm"}',
    keys.weights(f"{LARGE}-canary"): b"a group whose name only starts like the demo's",
    keys.legacy_weights(f"{LARGE}-canary"): b"a group whose name only starts like the demo's",
    keys.obs("cursor:transition"): b"41",
    keys.obs("cursor:audit"): b"7",
    keys.ALERTS_RESENT_AT: b"1767225600",
}
#: What an earlier demo run left (it refers to that run's database).
STALE_DEMO = {
    keys.weights(LARGE): b"stale",
    keys.legacy_weights(LARGE): b"stale",
    keys.state(SMALL): b"stale",
    keys.dedup(LARGE, 123): b"stale",
    keys.rejected_rows(f"demo-gateway:{SMALL}", 9): b"stale",
}


def _demo(port: int, tmp_path: Path, redis_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}", "REDIS_URL": redis_url,
           "PORT": str(port), "DEMO_SECONDS": "1", "DEMO_PASSWORD": "test-only", **extra}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return subprocess.run([sys.executable, "-m", "outlier_admin.demo"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_busy_port_is_refused_before_redis_or_the_database_is_touched(tmp_path, redis_client, settings):
    before = {**THEIRS, **STALE_DEMO}
    redis_client.mset(before)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = _demo(port, tmp_path, settings.REDIS_URL)
        took = time.monotonic() - started
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0] and "PORT" in lines[0], lines
    assert dict(zip(before, redis_client.mget(list(before)), strict=True)) == before  # not even its own stale keys
    assert not (tmp_path / "demo.sqlite3").exists()  # nor the database: nothing was migrated
    assert took < 120, took  # a hang guard: refusing must not wait for anything (the checks above say what)


def test_a_second_demo_on_the_same_redis_is_refused_and_changes_nothing(tmp_path, redis_client, settings):
    before = {**THEIRS, **STALE_DEMO}
    redis_client.mset(before)
    redis_client.set(LEASE_KEY, "pid 4242 port 8000 0123456789abcdef", px=10_000)  # a demo that runs
    proc = _demo(_free_port(), tmp_path, settings.REDIS_URL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "another demo runs on" in out and "pid 4242 port 8000" in out, out
    assert dict(zip(before, redis_client.mget(list(before)), strict=True)) == before
    assert redis_client.get(LEASE_KEY) == b"pid 4242 port 8000 0123456789abcdef"


def test_the_demo_deletes_its_own_groups_keys_and_no_other(redis_client):
    redis_client.mset({**THEIRS, **STALE_DEMO})
    redis_client.lpush(keys.ALERTS_FAILED, b"a colleague's undelivered alert")
    assert clear_demo_keys(redis_client) == len(STALE_DEMO)
    assert redis_client.exists(*STALE_DEMO) == 0
    assert dict(zip(THEIRS, redis_client.mget(list(THEIRS)), strict=True)) == THEIRS
    assert redis_client.llen(keys.ALERTS_FAILED) == 1


def test_own_key_is_a_whole_part_of_the_key():
    groups = (LARGE, SMALL)
    assert own_key(keys.tick_lock(LARGE), groups)
    assert own_key(keys.probe_inflight(SMALL, "a100-02").encode(), groups)
    assert own_key(keys.legacy_weights(LARGE), groups)
    assert not own_key(keys.weights(f"{LARGE}-canary"), groups)
    assert not own_key(keys.legacy_weights(f"{LARGE}-canary"), groups)
    assert not own_key(keys.weights(f"x{SMALL}"), groups)
    assert not own_key(keys.obs("cursor:transition"), groups)
