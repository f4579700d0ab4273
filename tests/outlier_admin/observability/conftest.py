from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
