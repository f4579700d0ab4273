"""The demo (``python -m outlier_admin.demo``) as a subprocess for browser tests and screenshots: its own
SQLite file, its own Redis database, a free port, a short fault schedule; stopped when the block ends.

The demo's canary servers bind ephemeral ports, so the dashboard's port is picked below that range
(as ``tests/outlier_admin/demo/test_demo_run.py`` does)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.gateways import free_low_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "test-only"


@dataclass
class Demo:
    """A running demo: its base URL, its SQLite file, when it started (epoch s) and its output so far."""

    url: str
    db: Path
    started: float
    proc: subprocess.Popen
    log: Path

    def query(self, sql: str, *args: object) -> list[tuple]:
        with contextlib.closing(sqlite3.connect(self.db, timeout=10)) as conn:
            return conn.execute(sql, args).fetchall()

    def node_pk(self, name: str) -> int:
        return self.query("SELECT id FROM fleet_node WHERE name = ?", name)[0][0]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, check, timeout: float) -> object:
        """Poll ``check()`` every 0.5 s until it returns something truthy; fail with the demo's output."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the demo exited while waiting for {what}:\n{self.output()[-4000:]}")
            got = check()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n{self.output()[-4000:]}")


@contextlib.contextmanager
def running_demo(tmp: Path, redis_url: str, **schedule: str) -> Iterator[Demo]:
    """Start the demo with ``schedule`` (``DEMO_*`` variables) and yield once its web server answers."""
    port = free_low_port()
    db = tmp / "demo.sqlite3"
    log = tmp / "demo.log"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "REDIS_URL": redis_url, "PORT": str(port),
           "DEMO_PASSWORD": PASSWORD, **schedule}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "outlier_admin.demo"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    demo = Demo(f"http://127.0.0.1:{port}", db, time.time(), proc, log)
    try:
        def up() -> bool:
            try:
                return httpx.get(demo.url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        demo.wait_for("the demo's web server", up, 300)  # migrations and 40 nodes on a busy machine
        yield demo
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def log_in(page, demo: Demo) -> None:
    page.goto(demo.url + "/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(demo.url + "/")


SCREEN = {"width": 1400, "height": 900}
LARGE = "demo-llama3-70b-h100"
THROTTLED = "h100-05"


def screenshots(page, demo: Demo, folder: Path, prefix: str) -> list[Path]:
    """The first screen (the viewport), the throttled node's page and its group's page (full pages),
    at 1400x900, as ``<prefix>-first-screen.png``, ``<prefix>-node.png``, ``<prefix>-group-heatmap.png``."""
    folder.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SCREEN)
    shots = [folder / f"{prefix}-first-screen.png", folder / f"{prefix}-node.png",
             folder / f"{prefix}-group-heatmap.png"]
    page.goto(demo.url + "/")
    page.screenshot(path=str(shots[0]))
    page.goto(f"{demo.url}/nodes/{demo.node_pk(THROTTLED)}/")
    page.screenshot(path=str(shots[1]), full_page=True)
    page.goto(f"{demo.url}/groups/{LARGE}/")
    page.locator("#heatmap svg").first.wait_for()
    page.screenshot(path=str(shots[2]), full_page=True)
    return shots
