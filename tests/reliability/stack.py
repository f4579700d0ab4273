"""The web tier as deployed, on loopback: a real gunicorn with the project's gunicorn_conf, and a real
nginx (``/usr/sbin/nginx``) running the shipped ``deploy/nginx/nginx.conf`` with only its two addresses
moved to free loopback ports (the listener, and the upstream that is compose's ``web:8000``)."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from harness.gateways import free_port

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
LISTEN = "listen 8080;"
UPSTREAM = "server web:8000;"
INGEST_UPSTREAM = "server ingest:8000;"


def local_config(listen_port: int, upstream_port: int, ingest_port: int | None = None) -> str:
    """The shipped config with its listener and upstreams on 127.0.0.1 (ingest's on ``ingest_port``, by
    default the web's: one gunicorn serves both); each must occur exactly once, so a change of the
    shipped file that this would no longer follow fails here."""
    text = NGINX_CONF.read_text()
    assert text.count(LISTEN) == 1 and text.count(UPSTREAM) == 1 and text.count(INGEST_UPSTREAM) == 1, \
        "deploy/nginx/nginx.conf: listener/upstreams moved"
    return (text.replace(LISTEN, f"listen 127.0.0.1:{listen_port};")
                .replace(UPSTREAM, f"server 127.0.0.1:{upstream_port};")
                .replace(INGEST_UPSTREAM, f"server 127.0.0.1:{ingest_port or upstream_port};"))


def nginx_check(conf_text: str, prefix: Path) -> subprocess.CompletedProcess:
    """``nginx -t`` of ``conf_text`` under ``prefix`` (the real binary's own parse and checks)."""
    conf = prefix / "nginx.conf"
    conf.write_text(conf_text)
    return subprocess.run([NGINX, "-t", "-p", f"{prefix}/", "-e", "stderr", "-c", str(conf)],
                          capture_output=True, text=True, timeout=30)


def get(port: int, path: str, timeout_s: float) -> tuple[int, float]:
    """One GET on a fresh connection: (status, seconds). Raises on a timeout or a refused connection."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Host": "127.0.0.1"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - t0
    finally:
        conn.close()


def wait_answering(port: int, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if get(port, path, 2.0)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"127.0.0.1:{port}{path} did not answer 200 within {timeout_s} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def gunicorn(log: Path, extra_env: dict[str, str] | None = None) -> Iterator[int]:
    """gunicorn as the image runs it (``-c python:outlier_admin.observability.gunicorn_conf``, its
    default workers and threads) on a free loopback port, its output in ``log``; yields the port."""
    port = free_port()
    from django.db import connection

    db = connection.settings_dict  # the suite's test database once django_db_setup ran (never the base one)
    env = {k: v for k, v in os.environ.items()
           if k not in ("WEB_CONCURRENCY", "GUNICORN_THREADS", "GUNICORN_CMD_ARGS", "PROMETHEUS_MULTIPROC_DIR")}
    env.update({"PORT": str(port), "WEB_BIND": "127.0.0.1", "OUTLIER_TESTING": "1", "LOG_JSON": "0",
                "DATABASE_URL": urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/x")
                ._replace(path=f"/{db['NAME']}").geturl(),
                **(extra_env or {})})
    out = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:outlier_admin.observability.gunicorn_conf",
         "outlier_admin.wsgi:application"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_answering(port, "/healthz", 60)
        yield port
    finally:
        _stop(proc)
        out.close()


@contextlib.contextmanager
def nginx(upstream_port: int, prefix: Path, wait_path: str = "/healthz", ingest_port: int | None = None,
          edit: Callable[[str], str] | None = None) -> Iterator[int]:
    """The shipped nginx config in front of ``upstream_port`` (and ``ingest_port`` for ingest; default:
    the same), changed by ``edit`` if given, its files and output (``out.log``) under ``prefix``; yields
    nginx's port."""
    port = free_port()
    conf = local_config(port, upstream_port, ingest_port)
    checked = nginx_check(edit(conf) if edit else conf, prefix)
    assert checked.returncode == 0, checked.stderr
    out = (prefix / "out.log").open("w")
    proc = subprocess.Popen([NGINX, "-p", f"{prefix}/", "-e", "stderr", "-c", str(prefix / "nginx.conf"),
                             "-g", "daemon off;"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_answering(port, wait_path, 20)
        yield port
    finally:
        _stop(proc)
        out.close()
