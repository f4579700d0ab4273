"""The agent README's "create the include once with ``--once``" before nginx first starts, on a real
nginx binary: it exited 1 (``nginx reload failed ... invalid PID``) because there was no nginx to
reload. The include is now written and validated, the missing reload said in the log, exit 0; a
running nginx whose reload fails still fails the apply."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.client import effective_weights
from agent.nginx import NginxApplier, nginx_not_running, upstream_name_for
from contract.weights_document import parse_document
from harness.gateways import (
    NGINX_BIN,
    NginxProcess,
    free_port,
    publish,
    wait_for_port,
    weights_document,
)

ROOT = Path(__file__).resolve().parents[2]
SERVERS = {"a": "127.0.0.1:18001", "b": "127.0.0.2:18001"}


def _agent(group: str, redis_url: str, include: Path, test_cmd: list[str], reload_cmd: list[str]
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--gateway", "nginx", "--group", group, "--redis-url", redis_url,
         "--nginx-include", str(include), "--nginx-test-cmd", shlex.join(test_cmd),
         "--nginx-reload-cmd", shlex.join(reload_cmd), "--once"],
        cwd=ROOT, capture_output=True, text=True, timeout=30)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (until the kernel hands it out again)


@pytest.mark.parametrize("pid_file", ["missing", "empty", "stale"])
def test_once_creates_the_include_before_nginx_first_starts(pid_file, tmp_path, redis_client, group, settings):
    include = tmp_path / "outlier" / "llm.conf"
    port = free_port()
    conf = tmp_path / "nginx.conf"
    pid = tmp_path / "nginx.pid"
    conf.write_text(
        f"worker_processes 1;\npid {pid};\nerror_log {tmp_path / 'error.log'};\nevents {{}}\n"
        f"http {{\n  access_log off;\n  include {include};\n"
        f"  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://{upstream_name_for(group)}; }} }}\n}}\n")
    if pid_file == "empty":
        pid.write_text("")  # what a distribution's package leaves before the first start
    elif pid_file == "stale":
        pid.write_text(f"{_dead_pid()}\n")  # an nginx that crashed
    base = [NGINX_BIN, "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")]
    publish(redis_client, weights_document(group, 1, SERVERS, quarantined=("b",)))

    proc = _agent(group, settings.REDIS_URL, include, [*base, "-t", "-q"], [*base, "-s", "reload"])

    assert proc.returncode == 0, proc.stderr
    assert "nginx is not running" in proc.stderr and "not reloaded" in proc.stderr, proc.stderr
    assert "server 127.0.0.1:18001 weight=100;" in include.read_text()
    assert "server 127.0.0.2:18001 down;" in include.read_text()
    # The include is the one nginx starts with.
    nginx = subprocess.Popen([*base, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)


def test_a_running_nginx_whose_reload_fails_still_fails(tmp_path, redis_client, group, settings):
    include = tmp_path / "outlier" / "llm.conf"
    upstream = upstream_name_for(group)
    NginxApplier(include, upstream, test_cmd=["true"], reload_cmd=["true"]).apply(
        effective_weights(parse_document(json.dumps(weights_document(group, 0, SERVERS))), time.time()))
    with NginxProcess(tmp_path / "nginx", include, upstream) as nginx:
        publish(redis_client, weights_document(group, 1, SERVERS, quarantined=("b",)))
        # A reload that nginx itself refuses (an unknown directive on its command line) while it runs.
        proc = _agent(group, settings.REDIS_URL, include, nginx.test_cmd,
                      [*nginx.reload_cmd, "-g", "no_such_directive on;"])
        assert proc.returncode == 1, proc.stderr
        assert "nginx reload failed" in proc.stderr and "not running" not in proc.stderr, proc.stderr

        publish(redis_client, weights_document(group, 2, SERVERS, quarantined=("a",)))
        old = nginx.worker_pids()
        proc = _agent(group, settings.REDIS_URL, include, nginx.test_cmd, nginx.reload_cmd)
        assert proc.returncode == 0, proc.stderr
        assert "not running" not in proc.stderr, proc.stderr
        nginx.wait_reloaded(old)  # reloaded for real


@pytest.mark.parametrize(("output", "not_running"), [
    ('nginx: [error] open() "/run/nginx.pid" failed (2: No such file or directory)', True),
    ('nginx: [error] invalid PID number "" in "/run/nginx.pid"', True),
    ("nginx: [alert] kill(4242, 1) failed (3: No such process)", True),
    ("nginx.service is not active, cannot reload.", True),
    ('nginx: [emerg] open() "/etc/nginx/nginx.conf" failed (2: No such file or directory)', False),
    ("nginx: [alert] kill(4242, 1) failed (1: Operation not permitted)", False),
    ('nginx: [emerg] unknown directive "no_such_directive" in command line', False),
    ("sh: 1: nginx: not found", False),
])
def test_which_reload_failures_mean_no_nginx_runs(output, not_running):
    assert nginx_not_running(output) is not_running
