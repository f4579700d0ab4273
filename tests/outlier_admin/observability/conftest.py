from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from harness.records import http_server


class Receiver:
    """A local HTTP receiver the test starts: records (path, JSON body); answers ``status``."""

    def __init__(self) -> None:
        self.received: list[tuple[str, object]] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.received.append((self.path, json.loads(body)))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self._serving = http_server(Handler)
        self.url = self._serving.__enter__()

    def close(self) -> None:
        self._serving.__exit__(None, None, None)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def fleet(db):
    """A group of 4 nodes created through the actions."""
    from outlier_admin.control.actions import do_create_group, do_register_node

    group = do_create_group("obs-g", actor="test")
    nodes = [do_register_node(group, f"127.0.0.{i}:8000", actor="test", name=f"n{i}") for i in range(4)]
    return group, nodes
