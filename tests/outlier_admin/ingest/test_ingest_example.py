"""docs/ingest.md's `## Example` runs as written: its setup commands, then its curl (real curl, the
documented body) against the real API served by a live server, whose answer is the documented one;
and the ingest path takes the trailing slash every other API path has, and still the bare one."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from outlier_admin.fleet.models import ApiToken

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "ingest.md").read_text()


def example() -> tuple[list[str], str, str]:
    """The `## Example` section's setup block, curl block and documented answer."""
    section = DOC.split("\n## Example\n", 1)[1].split("\n## ", 1)[0]
    setup, curl = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    [answer] = re.findall(r"^```json\n(.*?)^```", section, flags=re.S | re.M)
    return setup.strip().splitlines(), curl, answer


@pytest.mark.django_db(transaction=True)
@pytest.mark.services
def test_the_documented_curl_is_accepted_by_the_real_api(live_server, redis_client):
    setup, curl, answer = example()
    token = ""
    for line in setup:
        argv = shlex.split(line.split("$(", 1)[1].split("|")[0] if "$(" in line else line)
        assert argv[:2] == ["python", "manage.py"], line
        out = io.StringIO()
        call_command(*argv[2:], stdout=out, stderr=io.StringIO())
        if line.startswith("INGEST_TOKEN="):
            token = out.getvalue().strip().splitlines()[-1]
    assert ApiToken.objects.filter(scope="ingest").count() == 1 and token
    assert "http://127.0.0.1:8000/api/v1/ingest/requests/" in curl
    script = curl.replace("http://127.0.0.1:8000", live_server.url)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "INGEST_TOKEN": token})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(answer), done.stdout


@pytest.mark.django_db
@pytest.mark.services
def test_the_ingest_path_takes_the_trailing_slash_and_the_bare_one(redis_client, make_group):
    group = make_group("slash")
    from outlier_admin.control.actions import do_register_node

    do_register_node(group, "127.0.0.1:8001", actor="test")
    out = io.StringIO()
    call_command("create_token", "--scope", "ingest", "--name", "t", stdout=out, stderr=io.StringIO())
    auth = {"HTTP_AUTHORIZATION": f"Bearer {out.getvalue().strip().splitlines()[-1]}"}
    c = Client()
    for k, path in enumerate(("/api/v1/ingest/requests/", "/api/v1/ingest/requests")):
        body = [{"ts": time.time(), "node": "127.0.0.1:8001", "group": "slash", "total_ms": 900.0 + k}]
        resp = c.post(path, json.dumps(body), content_type="application/json", **auth)
        assert resp.status_code == 200 and resp.json()["accepted"] == 1, (path, resp.content)
