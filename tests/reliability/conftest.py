"""Fault fixtures: a PostgreSQL outage (the connection pointed at a closed port) and a private,
disposable redis-server (never the machine's shared Redis) that tests may stop and restart."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_down() -> Iterator[None]:
    """PostgreSQL unreachable for the code inside: the default connection is closed and pointed at a
    port nobody listens on (connection refused at once), then restored. A closed port, not a stopped
    server: the machine's PostgreSQL is shared."""
    from django.db import connection

    saved = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(free_port())
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = saved


class PrivateRedis:
    """A ``redis-server`` on a free loopback port (data in a temporary directory) that a test can stop/start."""

    def __init__(self, data_dir: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # No RDB snapshots; an fsync-always append-only file in a temporary directory, as a
        # production Redis holding the streams should be configured: a restart keeps the entries.
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.data_dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
            self.proc = None


@pytest.fixture
def private_redis(settings, tmp_path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not installed")
    from outlier_admin.control import redis_conn
    from outlier_admin.ingest.pipeline import directory

    server = PrivateRedis(str(tmp_path))
    server.start()
    settings.REDIS_URL = server.url
    redis_conn.set_redis(None)
    directory.clear()
    try:
        yield server
    finally:
        server.stop()
        directory.clear()


def wait_for(predicate, timeout_s: float, step_s: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout_s`` passes (None)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if (value := predicate()):
            return value
        time.sleep(step_s)
    return None
