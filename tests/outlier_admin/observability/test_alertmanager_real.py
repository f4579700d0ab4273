"""Against the real Debian ``prometheus-alertmanager`` (installed by scripts/ensure-system-packages.sh):
with ALERT_RESEND_S=2 an alert's first endsAt is 8 s after its send, so a quarantined node's alert that
is still active 30 s later is alive only because it is re-sent; after the node's release the next scan
resolves it — the same alert, no second one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from outlier_admin.control.actions import do_create_group, do_quarantine, do_register_node, do_release
from outlier_admin.control.tick import run_tick
from outlier_admin.observability.events import scan_events

RESEND_S = 2
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

CONFIG = """\
route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: "null"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path: Path):
    assert BINARY, "prometheus-alertmanager missing: run scripts/ensure-system-packages.sh"
    (tmp_path / "am.yml").write_text(CONFIG)
    port = _free_port()
    proc = subprocess.Popen(
        [BINARY, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"alertmanager did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _ours(url: str, node: str) -> list[dict]:
    """Alerts about ``node`` that Alertmanager's API lists (it leaves out resolved ones)."""
    got = httpx.get(url + "/api/v2/alerts", timeout=5).json()
    return [a for a in got if a["labels"].get("node") == node]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_quarantine_alert_stays_active_and_resolves_as_the_same_alert(settings, redis_client, alertmanager):
    settings.ALERTMANAGER_URLS = [alertmanager]
    settings.ALERTMANAGER_WEBHOOK_URLS, settings.ALERT_WEBHOOK_URLS = [], []
    settings.ALERT_RESEND_S = RESEND_S
    settings.ALERT_EXTERNAL_URL = "http://127.0.0.1:8000"
    group = do_create_group("am-g", actor="test")
    nodes = [do_register_node(group, f"127.0.0.{i}:8000", actor="test", name=f"am{i}") for i in range(1, 5)]
    target = nodes[0]
    do_quarantine(target, actor="test", reason="fan failure")
    run_tick(group)
    scan_events()

    [first] = _ours(alertmanager, target.name)
    assert first["status"]["state"] == "active"
    assert first["labels"]["group"] == "am-g" and first["labels"]["cause"] == "operator"
    assert first["generatorURL"] == f"http://127.0.0.1:8000/nodes/{target.pk}/"
    fingerprint = first["fingerprint"]

    # 18 s (2.25 times its first endsAt, 4 x RESEND_S: it outlives that twice over), the event scan
    # running as the beat would run it.
    start = time.monotonic()
    while time.monotonic() - start < 18:
        time.sleep(0.5)
        run_tick(group)
        scan_events()
        seen = _ours(alertmanager, target.name)
        assert [(a["fingerprint"], a["status"]["state"]) for a in seen] == [(fingerprint, "active")], \
            f"{time.monotonic() - start:.1f} s after firing"

    do_release(target, actor="test", reason="fan replaced")
    assert run_tick(group).states[target.name] == "healthy"
    # The next scan sends it resolved (endsAt now, the labels it fired with); Alertmanager then holds
    # no active alert about the node (the wait only guards against a hang).
    res = scan_events()
    assert ("resolved", target.name) in [(a.status, a.node) for a in res.alerts]
    deadline = time.monotonic() + 30
    while _ours(alertmanager, target.name):
        assert time.monotonic() < deadline, "Alertmanager did not take the resolve"
        time.sleep(0.2)
    # Resolved, not replaced: Alertmanager still holds the one alert, ended (it keeps resolved alerts
    # for a while); there is no second alert about the node.
    every = httpx.get(alertmanager + "/api/v2/alerts/groups", timeout=5).json()
    assert all(a["labels"].get("node") != target.name for g in every for a in g["alerts"])
    scan_events()
    assert _ours(alertmanager, target.name) == []
