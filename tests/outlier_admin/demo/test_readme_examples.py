"""The README's code examples run: the gateway client example (it raised AttributeError: the client
had no ``weights()``), the contract's JSON (a document the client accepts), every benchmark or
simulator command (its module or script exists and takes the flags the README gives it), and its
``python`` commands as written, in a shell that did what the README says first (they assumed the
project's venv without saying so)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from contract.weights_document import parse_document
from harness.gateways import publish, weights_document

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def test_the_gateway_client_example_runs(redis_client, settings):
    [example] = blocks("python")
    group = re.search(r'group="([^"]+)"', example).group(1)
    publish(redis_client, weights_document(group, 7, {"a": "127.0.0.1:8000", "b": "127.0.0.2:8000"},
                                           quarantined=("b",), weights={"a": 60}))
    # The example's Redis URL, pointed at the tests' Redis (the same URL where the tests use db 0).
    assert "redis://127.0.0.1:6379/0" in example
    code = example.replace("redis://127.0.0.1:6379/0", settings.REDIS_URL)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # the README's own example
    assert scope["weights"] == {"127.0.0.1:8000": 60, "127.0.0.2:8000": 0}


def test_the_example_with_redis_down_keeps_the_last_good_weights(redis_client):
    from agent.client import GatewayClient

    publish(redis_client, weights_document("g", 1, {"a": "127.0.0.1:8000"}, weights={"a": 40}))
    client = GatewayClient(redis_client, "g")
    assert client.weights() == {"127.0.0.1:8000": 40}
    client.redis_client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert client.weights() == {"127.0.0.1:8000": 40} and client.stats.redis_errors == 1


def test_the_contract_json_is_a_document_the_client_accepts():
    [doc] = [b for b in blocks("json") if '"nodes"' in b]
    parsed = parse_document(doc)
    assert parsed.skipped == () and [n.quarantined for n in parsed.nodes] == [False, True]
    assert json.loads(doc)["group"] == parsed.group


def commands() -> list[list[str]]:
    out = []
    for block in blocks("bash"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():  # a command continued with a backslash is one line
            line = line.split("  #")[0].strip()
            words = [w for w in shlex.split(line) if not re.fullmatch(r"[A-Z_]+=\S*", w)]
            if words and words[0] in ("python", ".venv/bin/python"):
                out.append(words[1:])
    return out


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:3]))
def test_every_readme_command_takes_its_flags(argv):
    if argv[0] == "-m":
        target, rest = ["-m", argv[1]], argv[2:]
    else:
        assert (ROOT / argv[0]).is_file(), argv[0]
        target, rest = [argv[0]], argv[1:]
    sub = [rest[0]] if rest and re.fullmatch(r"[a-z]+", rest[0]) else []  # a subcommand (sim run)
    proc = subprocess.run([sys.executable, *target, *sub, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"DJANGO_DEBUG": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in (w for w in rest if w.startswith("--")):
        assert flag.split("=")[0] in proc.stdout, f"{flag} not in the --help of {' '.join(argv[:2])}"


def test_commands_were_found():
    assert len(commands()) >= 8


def test_the_readme_says_how_its_python_commands_run_and_they_do():
    """The note near the quick start (the venv, ``DJANGO_DEBUG=1``) comes before the first ``python``
    command, and a shell that does what it says runs ``python manage.py`` and ``python -m`` as the
    README writes them; without it (no venv on the PATH) ``python`` is not the project's."""
    first_command = re.search(r"`python (manage\.py [a-z_]+|-m [a-z][a-z_.]*)", README).start()
    note = re.search(r"`(\. \.venv/bin/activate)`", README)
    assert note and note.start() < first_command, "the README does not say to activate the venv before its commands"
    assert "DJANGO_DEBUG=1" in README[:first_command]
    activate = note.group(1)
    assert (ROOT / ".venv" / "bin" / "activate").is_file()  # what make test and make demo create
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}  # a fresh shell: no venv on the PATH
    for command, expect in (("DJANGO_DEBUG=1 python manage.py help", "create_token"),
                            ("python -m sim run --help", "--plot")):
        proc = subprocess.run(["bash", "-c", f"{activate} && {command}"], cwd=ROOT, env=clean, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and expect in proc.stdout, (command, proc.stderr[-2000:])
