"""A real nginx and a real HAProxy writing their *default* access logs (no custom configuration of
ours), in front of fake inference servers on loopback, for the log-format tests.

* :class:`DefaultNginx`: nginx's ``combined`` (no ``log_format`` named) and the two common timed
  extensions, all three written for every request: ``combined`` + ``$request_time
  $upstream_response_time`` and ``combined`` + ``$request_time $upstream_addr
  $upstream_response_time``.
* :class:`DefaultHAProxy`: ``option httplog`` with no captures, over UDP syslog, and a runtime API
  socket (the shipper's node map).

Run as a script to regenerate the recorded fixtures in ``tests/fixtures/gateway-logs/``
(``python -m tests.outlier_admin.ingest.real_gateways``).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from harness.gateways import (
    HAPROXY_BIN,
    NGINX_BIN,
    SyslogCollector,
    _Process,
    free_port,
    send_traffic,
    wait_for_port,
    wait_for_socket,
)

COMBINED_PLUS = ('\'$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                 '"$http_referer" "$http_user_agent" ')
NGINX_LOGS = {
    "combined": None,  # nginx's built-in default
    "timed": COMBINED_PLUS + "$request_time $upstream_response_time'",
    "upstream": COMBINED_PLUS + "$request_time $upstream_addr $upstream_response_time'",
}


class DefaultNginx(_Process):
    """nginx round-robin over ``servers`` (name -> address), writing the :data:`NGINX_LOGS` files."""

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        self.workdir = Path(workdir)
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.logs = {name: self.workdir / f"{name}.log" for name in NGINX_LOGS}
        formats = "".join(f"    log_format {name} {fmt};\n" for name, fmt in NGINX_LOGS.items() if fmt)
        access = "".join(f"        access_log {self.logs[name]}{'' if fmt is None else ' ' + name};\n"
                         for name, fmt in NGINX_LOGS.items())
        temps = "".join(f"    {kind}_temp_path {self.workdir / 'tmp' / kind};\n"
                        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        upstream = "".join(f"        server {addr};\n" for addr in servers.values())
        config = self.workdir / "nginx.conf"
        config.write_text(
            "worker_processes 1;\n"
            f"pid {self.workdir / 'nginx.pid'};\n"
            f"error_log {self.workdir / 'error.log'} warn;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            f"{formats}{temps}"
            f"    upstream llm {{\n{upstream}    }}\n"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port};\n"
            f"{access}"
            "        location / { proxy_pass http://llm; }\n"
            "    }\n"
            "}\n"
        )
        cmd = [NGINX_BIN, "-p", str(self.workdir), "-c", str(config), "-e", str(self.workdir / "error.log")]
        self.proc = subprocess.Popen([*cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class DefaultHAProxy(_Process):
    """HAProxy round-robin over ``servers`` with the default ``option httplog`` sent to ``log_port``."""

    def __init__(self, workdir: Path, servers: dict[str, str], *, log_port: int, backend: str = "llm") -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.backend = backend
        self.socket_path = str(self.workdir / "admin.sock")
        config = self.workdir / "haproxy.cfg"
        config.write_text(
            "global\n"
            f"    stats socket {self.socket_path} mode 600 level admin\n"
            f"    log 127.0.0.1:{log_port} local0 info\n"
            "defaults\n"
            "    mode http\n    log global\n    option httplog\n"
            "    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n"
            "frontend llm_in\n"
            f"    bind 127.0.0.1:{self.port}\n"
            f"    default_backend {backend}\n"
            f"backend {backend}\n"
            "    balance roundrobin\n"
            + "".join(f"    server {name} {addr}\n" for name, addr in servers.items())
        )
        self.proc = subprocess.Popen([HAPROXY_BIN, "-db", "-f", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_socket(self.socket_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_lines(read, n: int, timeout_s: float = 10.0) -> list[str]:
    """``read()`` (a list of lines) once it holds at least ``n`` lines."""
    deadline = time.monotonic() + timeout_s
    lines = read()
    while len(lines) < n and time.monotonic() < deadline:
        time.sleep(0.05)
        lines = read()
    return lines


def _record_fixtures() -> None:  # pragma: no cover - run by hand
    import tempfile

    from harness.gateways import FakeInferenceServer

    out = Path(__file__).resolve().parents[2] / "fixtures" / "gateway-logs"
    servers = {f"s{i}": FakeInferenceServer(f"s{i}", base_delay_s=0.01 * (i + 1)) for i in range(2)}
    addrs = {name: srv.address for name, srv in servers.items()}
    with tempfile.TemporaryDirectory() as tmp:
        with DefaultNginx(Path(tmp) / "nginx", addrs) as nginx:
            send_traffic(nginx.url, 6)
            for name, path in nginx.logs.items():
                lines = wait_lines(lambda p=path: p.read_text().splitlines(), 6)
                (out / f"nginx-1.22-{name}.log").write_text("\n".join(lines) + "\n")
        logs = SyslogCollector()
        try:
            with DefaultHAProxy(Path(tmp) / "haproxy", addrs, log_port=logs.port) as haproxy:
                send_traffic(haproxy.url, 6)
                lines = wait_lines(lambda: [x for x in logs.lines if "llm_in" in x], 6)
            (out / "haproxy-2.6-httplog-default.log").write_text("\n".join(lines) + "\n")
        finally:
            logs.stop()
    for srv in servers.values():
        srv.stop()


if __name__ == "__main__":
    _record_fixtures()
