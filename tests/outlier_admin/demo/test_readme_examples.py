"""The README and the gateway contract's examples run: the gateway client example of
``docs/gateways.md`` (it raised AttributeError: the client had no ``weights()``), the contract's JSON
there (a document the client accepts), and the README's ``python`` commands as written, in a shell
that did what the README says first (they assumed the project's venv without saying so). Every other
command of the docs is checked by ``tests/test_docs.py``."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import redis

from contract.weights_document import parse_document
from harness.gateways import publish, weights_document

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
GATEWAYS = (ROOT / "docs" / "gateways.md").read_text()


def blocks(lang: str, text: str = GATEWAYS) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def test_the_gateway_client_example_runs(redis_client, settings):
    [example] = blocks("python")
    group = re.search(r'group="([^"]+)"', example).group(1)
    publish(redis_client, weights_document(group, 7, {"a": "127.0.0.1:8000", "b": "127.0.0.2:8000"},
                                           quarantined=("b",), weights={"a": 60}))
    # The example's Redis URL, pointed at the tests' Redis (the same URL where the tests use db 0).
    assert "redis://127.0.0.1:6379/0" in example
    code = example.replace("redis://127.0.0.1:6379/0", settings.REDIS_URL)
    scope: dict = {}
    exec(compile(code, "docs/gateways.md", "exec"), scope)  # the doc's own example
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
    assert parsed.skipped == () and [n.quarantined for n in parsed.nodes] == [False, True, False]
    assert json.loads(doc)["group"] == parsed.group


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
