"""The agent loop around an applier: logging, safeguard, errors and retry, metrics, status file, CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client import generate_latest

from agent.__main__ import main
from agent.base import ApplyError, ApplyResult
from agent.client import GatewayClient
from agent.core import Agent
from agent.envoy import EnvoyApplier, seed_discovery_response
from agent.metrics import make_registry
from contract import keys
from harness.gateways import publish, weights_document

SERVERS = {"a": "127.0.0.1:8000", "b": "127.0.0.2:8000"}


class FlakyApplier:
    """A gateway that refuses the first ``failures`` applies, then records what it got."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.applied = []
        self.safeguard = []

    def apply(self, weights):
        if self.failures:
            self.failures -= 1
            raise ApplyError("gateway said no")
        self.applied.append(weights.version)
        return ApplyResult(changes=[f"v{weights.version}"], unknown=["be/x (1.2.3.4:5)"])

    def set_safeguard(self, active):
        self.safeguard.append(active)


def test_apply_error_is_counted_and_retried(redis_client, group, tmp_path, caplog):
    applier = FlakyApplier(failures=2)
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=0.2), applier,
                  status_file=str(tmp_path / "status.json"))
    publish(redis_client, weights_document(group, 4, SERVERS, safeguard=True))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    caplog.set_level(logging.INFO, logger="agent")
    thread.start()
    try:
        deadline = time.time() + 8
        while not applier.applied and time.time() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert applier.applied == [4]
    assert agent.state.apply_errors == 2 and agent.state.version == 4 and agent.state.last_error == ""
    assert applier.safeguard == [True]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["version"] == 4 and status["safeguard"] is True and status["mode"] == "live"
    assert status["unknown"] == ["be/x (1.2.3.4:5)"]
    text = caplog.text
    assert "apply failed" in text and "SAFEGUARD active" in text and "v4" in text and "left alone" in text


def test_metrics(redis_client, group):
    agent = Agent(GatewayClient(redis_client, group), FlakyApplier(failures=0))
    publish(redis_client, weights_document(group, 9, SERVERS, generated_at=time.time() - 5))
    assert agent.run_once()
    out = generate_latest(make_registry(agent)).decode()
    labels = f'gateway="flaky",group="{group}"'
    assert f"outlier_agent_last_applied_version{{{labels}}} 9.0" in out
    assert f"outlier_agent_apply_errors_total{{{labels}}} 0.0" in out
    assert f"outlier_agent_fail_open{{{labels}}} 0.0" in out
    assert f"outlier_agent_unknown_servers{{{labels}}} 1.0" in out
    age = float(out.split(f"outlier_agent_weights_age_seconds{{{labels}}} ")[1].split()[0])
    assert 4.5 < age < 30


def test_cli_once_envoy(redis_client, group, tmp_path, settings):
    publish(redis_client, weights_document(group, 2, SERVERS, quarantined=("b",)))
    eds = tmp_path / "eds.json"
    eds.write_text(json.dumps(seed_discovery_response(SERVERS, group)))  # the operator's seed (docs/gateways.md)
    assert main(["--gateway", "envoy", "--group", group, "--redis-url", settings.REDIS_URL,
                 "--envoy-eds-path", str(eds), "--once"]) == 0
    eps = json.loads(eds.read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert [e["health_status"] for e in eps] == ["HEALTHY", "DRAINING"]
    # No document for another group: exit code 1, nothing written.
    none = tmp_path / "none.json"
    none.write_text(json.dumps(seed_discovery_response(SERVERS, group + "-none")))
    assert main(["--gateway", "envoy", "--group", group + "-none", "--redis-url", settings.REDIS_URL,
                 "--envoy-eds-path", str(none), "--once"]) == 1
    assert json.loads(none.read_text())["version_info"] == seed_discovery_response(SERVERS, group + "-none")["version_info"]
    # No EDS file at all: the apply fails with the reason (exit 1), nothing is invented.
    assert main(["--gateway", "envoy", "--group", group, "--redis-url", settings.REDIS_URL,
                 "--envoy-eds-path", str(tmp_path / "missing.json"), "--once"]) == 1
    assert not (tmp_path / "missing.json").exists()


def test_envoy_applier_through_agent_fail_open(redis_client, group, tmp_path):
    (tmp_path / "e.json").write_text(json.dumps(seed_discovery_response(SERVERS, "c")))
    agent = Agent(GatewayClient(redis_client, group), EnvoyApplier(tmp_path / "e.json", "c"))
    publish(redis_client, weights_document(group, 1, SERVERS, quarantined=("a",)))
    assert agent.run_once()
    eps = json.loads((tmp_path / "e.json").read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert [e["health_status"] for e in eps] == ["DRAINING", "HEALTHY"]
    publish(redis_client, weights_document(group, 2, SERVERS, quarantined=("a",), generated_at=time.time() - 120,
                                           stale_after_s=60))
    assert agent.run_once()
    assert agent.state.mode == "fail_open"
    eps = json.loads((tmp_path / "e.json").read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert {e["health_status"] for e in eps} == {"HEALTHY"}


BLOCKED_IMPORT_CHECK = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("django", "rest_framework", "celery", "psycopg"):
            raise ImportError("not installed on a gateway host: " + name)
        return None

sys.meta_path.insert(0, Block())
import agent.client, agent.__main__, harness.gateways
import agent.shipper
# The agent imports the contract and nothing of the control plane or the detector.
assert not {m.split(".")[0] for m in sys.modules} & {"outlier_admin", "detector"}, sorted(sys.modules)
print("ok")
"""


def test_agent_and_client_import_without_django():
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT_CHECK], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_agent_reports_the_version_it_applied_and_only_after_applying(redis_client, group, settings, tmp_path):
    """The first screen shows what the gateways really run: an agent writes ``{version, applied_at,
    mode}`` under its id once an apply succeeded, never for a refused one."""
    key = keys.applied(group)
    flaky = Agent(GatewayClient(redis_client, group), FlakyApplier(failures=1), gateway_id="gw-1/flaky")
    publish(redis_client, weights_document(group, 5, SERVERS))
    with pytest.raises(ApplyError):
        flaky.run_once()
    assert redis_client.hgetall(key) == {}
    before = time.time()
    assert flaky.run_once()
    report = json.loads(redis_client.hget(key, "gw-1/flaky"))
    # applied_at is rounded to the millisecond
    assert report["version"] == 5 and report["mode"] == "live" and before - 0.001 <= report["applied_at"] <= time.time() + 0.001
    assert 0 < redis_client.ttl(key) <= 86400
    # The CLI names the gateway with --gateway-id.
    publish(redis_client, weights_document(group, 6, SERVERS))
    (tmp_path / "e.json").write_text(json.dumps(seed_discovery_response(SERVERS, group)))
    assert main(["--gateway", "envoy", "--group", group, "--redis-url", settings.REDIS_URL, "--gateway-id", "edge-3",
                 "--envoy-eds-path", str(tmp_path / "e.json"), "--once"]) == 0
    assert json.loads(redis_client.hget(key, "edge-3"))["version"] == 6
