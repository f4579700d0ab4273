"""deploy/systemd: the agent's unit passes `systemd-analyze verify` (pointed at this checkout's
console script and the example environment file), and the example environment file configures the
agent's real option parser without an unknown variable."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_compose import ROOT, console_scripts

UNIT = ROOT / "deploy" / "systemd" / "outlier-agent@.service"
ENV_EXAMPLE = ROOT / "deploy" / "systemd" / "outlier-agent.env.example"
AGENT = ROOT / ".venv" / "bin" / "outlier-agent"


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    unit = tmp_path / "outlier-agent@.service"
    unit.write_text(unit_text)
    return subprocess.run(["systemd-analyze", "verify", str(tmp_path / "outlier-agent@llama.service")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.skipif(not shutil.which("systemd-analyze") or not AGENT.exists(),
                    reason="needs systemd-analyze and the .venv's outlier-agent script")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = UNIT.read_text()
    program = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
    assert Path(program).name in console_scripts()
    local = re.sub(r"^ExecStart=\S+", f"ExecStart={AGENT}", text, flags=re.M)
    local = re.sub(r"^EnvironmentFile=\S+", f"EnvironmentFile={ENV_EXAMPLE}", local, flags=re.M)
    out = _verify(local, tmp_path)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    # The check can fail: a misspelt directive is reported.
    out = _verify(local.replace("ProtectHome=yes", "ProtectHoem=yes"), tmp_path)
    assert "ProtectHoem" in out.stderr


def test_the_example_environment_configures_the_real_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.__main__ import build_applier, build_parser

    env = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
               if line.strip() and not line.startswith("#"))
    dests = {a.dest for a in build_parser()._actions}
    for name, value in env.items():
        if name != "REDIS_URL":
            assert name.startswith("OUTLIER_AGENT_") and name.removeprefix("OUTLIER_AGENT_").lower() in dests, name
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OUTLIER_AGENT_STATUS_FILE", "/run/outlier-agent/llama.json")  # the unit's Environment=
    args = build_parser().parse_args([])
    assert (args.group, args.gateway, args.haproxy_backend) == ("llama-70b-h100", "haproxy", "llama")
    assert args.redis_url == env["REDIS_URL"] and args.metrics_port == 9105
    assert args.status_file == "/run/outlier-agent/llama.json"
    build_applier(args)  # SystemExit on a missing option
