"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every service's command
names an entry point that exists in this repository (module, file, Celery app, WSGI callable)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
APP_SERVICES = ("web", "worker", "beat", "demo")


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def console_scripts() -> dict[str, str]:
    """pyproject.toml's ``[project.scripts]``: program name -> ``module:function``."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def check_command(argv: list[str]) -> None:
    """Assert the program and its target exist (recursing into ``sh -c`` and ``&&`` chains)."""
    if argv[:2] == ["sh", "-c"]:
        for part in argv[2].split("&&"):
            words = shlex.split(part)
            check_command(words[1:] if words[0] == "exec" else words)
        return
    prog = argv[0]
    if prog == "python" and argv[1] == "-m":
        assert _module_exists(argv[2]), f"python -m {argv[2]}: no such module"
        assert _module_exists(argv[2] + ".__main__") or argv[2].endswith("__main__") or (
            ROOT / (argv[2].replace(".", "/") + ".py")).exists(), f"{argv[2]} is not runnable"
    elif prog == "python":
        assert (ROOT / argv[1]).exists(), f"python {argv[1]}: no such file"
    elif prog == "celery":
        app = argv[argv.index("-A") + 1]
        assert _module_exists(f"{app}.celery"), f"celery -A {app}: no {app}.celery module"
        assert argv[argv.index("-A") + 2] in ("worker", "beat")
    elif prog == "gunicorn":
        conf = argv[argv.index("-c") + 1]
        assert conf.startswith("python:") and _module_exists(conf.removeprefix("python:")), conf
        module, _, attr = argv[-1].partition(":")
        assert _module_exists(module), f"gunicorn target {module}: no such module"
        source = Path(importlib.util.find_spec(module).origin).read_text()
        assert re.search(rf"^{attr or 'application'}\s*=", source, re.M), f"{argv[-1]}: no such callable"
    elif prog in console_scripts():
        module, _, func = console_scripts()[prog].partition(":")
        assert callable(getattr(importlib.import_module(module), func, None)), f"{prog}: no {module}:{func}"
    elif prog == "redis-server":
        pass  # the official image's entry point
    elif prog == "nginx":  # the official image's binary, run on the shipped config (tests/deploy/test_nginx.py)
        assert argv[argv.index("-c") + 1] == "/etc/nginx/nginx.conf" and argv[-2:] == ["-g", "daemon off;"], argv
        assert argv[argv.index("-p") + 1] == "/tmp/", "relative paths of the config (pid, temp files) go under /tmp/"
    else:
        pytest.fail(f"unknown program {prog!r} in a service command")


@pytest.mark.parametrize("service", sorted(COMPOSE["services"]))
def test_every_service_command_names_an_existing_entry_point(service: str) -> None:
    command = COMPOSE["services"][service].get("command")
    if command is None:
        assert "image" in COMPOSE["services"][service]  # runs its image's default entry point
        return
    check_command(command if isinstance(command, list) else shlex.split(command))


def test_the_stack_has_the_services_health_checks_and_named_volumes() -> None:
    services = COMPOSE["services"]
    assert {"postgres", "redis", "proxy", "web", "worker", "beat", "demo"} <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no health check"
    assert services["demo"]["profiles"] == ["demo"]
    assert set(COMPOSE["volumes"]) == {"pgdata", "redisdata"}
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= set(env), name
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert services[name]["build"] == "."


def test_the_web_health_check_uses_readyz_which_exists() -> None:
    from django.urls import resolve

    test = " ".join(COMPOSE["services"]["web"]["healthcheck"]["test"])
    assert "/readyz" in test
    assert resolve("/readyz").func.__name__ == "readyz"


def test_dockerfile_default_command_is_the_gunicorn_web_server() -> None:
    text = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    import json

    check_command(json.loads(cmd.group(1)))
    assert "PROMETHEUS_MULTIPROC_DIR" in text and "collectstatic" in text


def test_env_example_documents_every_variable_the_compose_file_reads() -> None:
    names = set(re.findall(r"\$\{([A-Z_]+)", (ROOT / "docker-compose.yml").read_text()))
    documented = {line.split("=")[0].lstrip("# ").strip()
                  for line in (ROOT / ".env.example").read_text().splitlines() if "=" in line}
    assert names <= documented, f"undocumented: {sorted(names - documented)}"


@pytest.mark.slow
def test_the_beat_health_check_follows_a_real_beat_schedule(tmp_path: Path) -> None:
    """A real ``celery beat`` (in-memory broker) writes its shelve; the compose check, pointed at
    the same directory, passes while the files are fresh and fails once they are 11 minutes old.
    Without gdbm (as on this machine's Python) the files are .bak/.dat/.dir, which the old
    ``test -f /tmp/celerybeat-schedule`` never found."""
    check = COMPOSE["services"]["beat"]["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL"
    script = check[1].replace("$$", "$").replace("find /tmp ", f"find {tmp_path} ")
    command = COMPOSE["services"]["beat"]["command"]
    schedule = command[command.index("--schedule") + 1]
    assert schedule == "/tmp/celerybeat-schedule"
    env = {**os.environ, "CELERY_BROKER_URL": "memory://"}
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "outlier_admin", "beat", "--loglevel", "WARNING",
                             "--schedule", str(tmp_path / "celerybeat-schedule")], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("celerybeat-schedule*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        beat.terminate()
        beat.wait(timeout=30)
    files = sorted(p.name for p in tmp_path.glob("celerybeat-schedule*"))
    assert files, "beat wrote no schedule"
    assert subprocess.run(["sh", "-c", script]).returncode == 0
    if "celerybeat-schedule" not in files:  # dbm.dumb: the old check fails here
        assert subprocess.run(["sh", "-c", f"test -f {tmp_path}/celerybeat-schedule"]).returncode != 0
    old = time.time() - 11 * 60
    for p in tmp_path.glob("celerybeat-schedule*"):
        os.utime(p, (old, old))
    assert subprocess.run(["sh", "-c", script]).returncode != 0


def test_only_the_nginx_proxy_is_published_in_front_of_gunicorn() -> None:
    """Slow clients would hold gunicorn's threads (issue 29): gunicorn is reached only through the
    proxy service, which runs the shipped deploy/nginx/nginx.conf and publishes the stack's port."""
    services = COMPOSE["services"]
    web, proxy = services["web"], services["proxy"]
    assert "ports" not in web and web["expose"] == ["8000"]
    assert web["environment"]["PORT"] == "8000"  # the config's upstream web:8000, whatever .env's PORT says
    assert "server web:8000;" in (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    assert proxy["ports"] == ["${PORT:-8000}:8080"] and "listen 8080;" in (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    source, target, mode = proxy["volumes"][0].split(":")
    assert (ROOT / source).resolve() == (ROOT / "deploy" / "nginx" / "nginx.conf").resolve()
    assert target == proxy["command"][proxy["command"].index("-c") + 1] and mode == "ro"
    assert proxy["depends_on"]["web"] == {"condition": "service_healthy", "restart": True}
    published = [name for name, svc in services.items() if svc.get("ports") and "demo" not in svc.get("profiles", [])]
    assert published == ["proxy"]
    # The proxy is the peer of every request: the web trusts its X-Forwarded-For, and only its network's.
    edge = COMPOSE["networks"]["web-edge"]["ipam"]["config"][0]["subnet"]
    assert web["environment"]["TRUSTED_PROXIES"].split(",")[0] == edge
    assert set(web["networks"]) == {"default", "web-edge"} and proxy["networks"] == ["web-edge"]
    assert [n for n, svc in services.items() if "web-edge" in svc.get("networks", [])] == ["web", "ingest", "proxy"]


def test_ingest_is_a_gunicorn_process_group_of_its_own_behind_the_proxy() -> None:
    """Issue 36, finding 3: ingest and the operator surface shared gunicorn's threads. The proxy routes
    /api/v1/ingest/ to the ingest service (the same image and gunicorn config, its own processes, a
    quarter of the web's CPU weight), which trusts the proxy as the web does and is not published."""
    services = COMPOSE["services"]
    web, ingest, proxy = services["web"], services["ingest"], services["proxy"]
    conf = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    assert "server ingest:8000;" in conf and "location /api/v1/ingest/ {" in conf
    assert ingest["command"] == web["command"][-1].split("exec ", 1)[1].split()
    assert ingest["environment"]["PORT"] == "8000" and "ports" not in ingest and ingest["expose"] == ["8000"]
    assert ingest["environment"]["TRUSTED_PROXIES"] == web["environment"]["TRUSTED_PROXIES"]
    assert ingest["cpu_shares"] < web.get("cpu_shares", 1024)
    assert proxy["depends_on"]["ingest"] == {"condition": "service_healthy", "restart": True}
