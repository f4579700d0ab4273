"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every service's command
names an entry point that exists in this repository (module, file, Celery app, WSGI callable)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
APP_SERVICES = ("web", "worker", "beat", "demo")


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _check_command(argv: list[str]) -> None:
    """Assert the program and its target exist (recursing into ``sh -c`` and ``&&`` chains)."""
    if argv[:2] == ["sh", "-c"]:
        for part in argv[2].split("&&"):
            words = shlex.split(part)
            _check_command(words[1:] if words[0] == "exec" else words)
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
    elif prog == "redis-server":
        pass  # the official image's entry point
    else:
        pytest.fail(f"unknown program {prog!r} in a service command")


@pytest.mark.parametrize("service", sorted(COMPOSE["services"]))
def test_every_service_command_names_an_existing_entry_point(service: str) -> None:
    command = COMPOSE["services"][service].get("command")
    if command is None:
        assert "image" in COMPOSE["services"][service]  # runs its image's default entry point
        return
    _check_command(command if isinstance(command, list) else shlex.split(command))


def test_the_stack_has_the_services_health_checks_and_named_volumes() -> None:
    services = COMPOSE["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "demo"} <= set(services)
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

    _check_command(json.loads(cmd.group(1)))
    assert "PROMETHEUS_MULTIPROC_DIR" in text and "collectstatic" in text


def test_env_example_documents_every_variable_the_compose_file_reads() -> None:
    names = set(re.findall(r"\$\{([A-Z_]+)", (ROOT / "docker-compose.yml").read_text()))
    documented = {line.split("=")[0].lstrip("# ").strip()
                  for line in (ROOT / ".env.example").read_text().splitlines() if "=" in line}
    assert names <= documented, f"undocumented: {sorted(names - documented)}"
