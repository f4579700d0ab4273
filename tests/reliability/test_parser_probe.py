"""Issue 29 finding 1, the probe's scripts: adversarial log lines of every format through the real
tailer, and a real nginx on 127.0.0.1 logging a 6 KB Basic-auth user name raw into ``$remote_user``
while ``tail_logs`` reads them. Before the fix 100 KB lines cost 52-202 s each and 200 such requests
(sent in 1.9 s) kept the worker busy about 45 s. What is asserted is behaviour: every line is taken or
refused with its reason, and no client-written field becomes a node. How fast is a figure, printed and
not asserted: that parsing is linear in the line is ``tests/security/test_parser_linear_time.py``'s rule
(a ratio of sizes, no wall clock), and a parser back at tens of seconds a line runs into the test's
timeout."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import urllib.request

import pytest
from django.core.management import call_command

from contract import keys
from harness.gateways import FakeInferenceServer
from outlier_admin.ingest.models import IngestSource
from outlier_admin.ingest.pipeline import IngestOutcome
from outlier_admin.ingest.tailer import tail_source
from tests.outlier_admin.ingest.real_gateways import DefaultNginx, wait_lines
from tests.security.adversarial_lines import TEMPLATES, UNITS, build

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

REQUESTS = 200
USER = ("a b: [x] " * 700)[:6000]  # 6 KB, spaces, brackets: what nginx logs raw


def _send(url: str, n: int) -> None:
    # user:password, the user name before the first ':' (RFC 7617): the colons go into the password.
    name = USER.replace(":", ";")
    auth = "Basic " + base64.b64encode(f"{name}:pw".encode()).decode()
    for i in range(n):
        req = urllib.request.Request(f"{url}/v1/completions", data=b'{"prompt": "x"}', method="POST",
                                     headers={"Authorization": auth, "Content-Type": "application/json",
                                              "User-Agent": f'curl/8" "atk-{i}" "llm" "127.0.4.3:18950'})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()


def test_a_6_kb_remote_user_through_a_real_nginx_is_read_by_tail_logs(tmp_path, redis_client, make_group):
    make_group("llm")
    servers = {f"s{i}": FakeInferenceServer(f"s{i}", base_delay_s=0.001) for i in range(2)}
    try:
        with DefaultNginx(tmp_path, {k: s.address for k, s in servers.items()}) as nginx:
            started = time.perf_counter()
            threads = [threading.Thread(target=_send, args=(nginx.url, REQUESTS // 4)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sent_s = time.perf_counter() - started
            lines = wait_lines(lambda: nginx.logs["upstream"].read_text().splitlines(), REQUESTS)
            assert len(lines) == REQUESTS and all(len(line) > 6000 for line in lines)
            started = time.perf_counter()
            out = io.StringIO()
            call_command("tail_logs", "--add", "probe", "--path", str(nginx.logs["upstream"]), "--group", "llm",
                         "--once", stdout=out)
            tail_s = time.perf_counter() - started
    finally:
        for srv in servers.values():
            srv.stop()
    print(json.dumps({"requests": REQUESTS, "line_bytes": len(lines[0]), "sent_s": round(sent_s, 3),
                      "tail_s": round(tail_s, 3)}))
    # nginx wrote the client's quotes as \x22: every line is its real node's, none 127.0.4.3's.
    assert out.getvalue().splitlines()[0] == f"probe: accepted {REQUESTS} ({REQUESTS} latency-only) rejected 0"
    rows = [f for _, f in redis_client.xrange(keys.stream("llm"))]
    assert rows and b"127.0.4.3" not in b"".join(v for f in rows for v in f.values())


def test_adversarial_lines_of_every_format_through_the_tailer(tmp_path, redis_client, make_group):
    """100 KB lines of every template and unit: the source reads them all, each refused or taken."""
    make_group("llm")
    figures = {}
    for fmt, templates in TEMPLATES.items():
        path = tmp_path / f"{fmt}.log"
        lines = [build(t, u, 100_000) for t in templates for u in UNITS[::4]]
        path.write_text("\n".join(lines) + "\n")
        src = IngestSource.objects.create(name=f"adv-{fmt}", kind="log", location=str(path), log_format=fmt,
                                          default_group=None)
        started = time.perf_counter()
        out = IngestOutcome()
        for _ in range(10):  # a pass reads at most tailer.MAX_BYTES
            out.add(tail_source(IngestSource.objects.get(pk=src.pk)))
        seconds = time.perf_counter() - started
        figures[fmt] = {"lines": len(lines), "mb": round(path.stat().st_size / 1e6, 1), "s": round(seconds, 3),
                        "reasons": dict(sorted({r: n for (r, _), n in out.rejected_by_reason.items()}.items()))}
        assert out.accepted + out.rejected + out.duplicates == sum(1 for line in lines if line.strip())
    print(json.dumps(figures, indent=1))
