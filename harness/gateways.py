"""End-to-end harness: fake inference servers, per-test HAProxy and nginx processes, loopback traffic.

Used by ``tests/agent/test_e2e_*.py`` and ``python -m bench.agent``.
Everything binds 127.0.0.1 on ephemeral ports, lives in one temp directory (config, pid, socket,
logs), and every process is started by us and stopped by pid (``stop()``; also a context manager).

* ``FakeInferenceServer``: OpenAI-compatible ``POST /v1/completions`` and ``/v1/chat/completions``
  (plus the health and model-info routes LLM routers probe, ``_INFO_ROUTES``); sleeps
  ``base_delay_s * slowdown`` per request, answers with ``usage`` token counts and the header
  ``X-Served-By: <name>`` so a client can count each server's share.
* ``HAProxyProcess``: ``balance roundrobin`` backend over the servers, runtime API on a UNIX stats
  socket (``level admin``), HTTP logs (``option httplog``) sent over UDP to a ``SyslogCollector``.
* ``NginxProcess``: ``proxy_pass`` to the upstream rendered in an include file by the agent.
* ``send_traffic``: bounded sequential requests (one connection each, so each request is balanced
  on its own), returns per-server counts and latencies.
* ``FakeServerFleet``: the fake servers in their own process (``python -m
  harness.gateways``), controlled through ``/admin/slowdown`` and ``/admin/stats``;
  used when the control plane judges their latency (no GIL noise from the test process).
* ``TrafficLoop``: concurrent bounded background traffic with varied prompt / ``max_tokens``,
  every answer kept with its time so shares can be counted per phase.
* ``CeleryWorker``: ``celery -A outlier_admin worker --beat`` as a subprocess (the control plane).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from contract import keys
from contract.traffic import DEFAULT_BASE_WEIGHT
from contract.weights_document import WeightsDocument

HAPROXY_BIN = shutil.which("haproxy") or "/usr/sbin/haproxy"
NGINX_BIN = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_low_port() -> int:
    """A free port *below* the kernel's ephemeral range (20000-29999): the demo's simulated nodes each
    bind an ephemeral port for their canary endpoint, and one of them could take a port picked from
    that range before the demo's dashboard binds it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")


def wait_for_port(port: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Gateways close idle upstream connections with a reset; that is not a test failure.
        return


def wait_for_socket(path: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            if os.path.exists(path) and s.connect_ex(path) == 0:
                s.sendall(b"show info\n")
                s.recv(1024)
                return
        time.sleep(0.02)
    raise TimeoutError(f"no stats socket at {path} after {timeout_s}s")


class _Process:
    """A gateway process we started; ``stop()`` ends it by pid (SIGTERM, then SIGKILL)."""

    proc: subprocess.Popen[bytes] | None = None
    workdir: Path

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The model name the fake servers serve (``/v1/models``) and answer with.
FAKE_MODEL = "fake"

#: Routes a router probes before (and while) it routes to a worker: health checks
#: (``/health``, ``/health_generate``) and the engine/model discovery of SGLang Model Gateway and
#: vLLM router (``/v1/models``, ``/get_model_info``, ``/get_server_info``, ``/server_info``,
#: ``/version``). Answered at once, not counted as completions.
_INFO_ROUTES = frozenset({"/health", "/health_generate", "/v1/models", "/get_model_info", "/get_server_info",
                          "/server_info", "/version"})


def _info_body(route: str, name: str) -> dict[str, Any]:
    if route == "/v1/models":
        return {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "created": 0,
                                            "owned_by": "outlier-admin-harness", "root": FAKE_MODEL,
                                            "max_model_len": 4096}]}
    if route == "/get_model_info":
        return {"model_path": FAKE_MODEL, "tokenizer_path": None, "is_generation": True}
    if route in ("/get_server_info", "/server_info"):
        return {"model_path": FAKE_MODEL, "served_model_name": FAKE_MODEL, "name": name}
    if route == "/version":
        return {"version": "0.0.0-fake"}
    return {"status": "ok"}


def _chat_prompt(payload: dict[str, Any]) -> str:
    """The text of a chat request's messages (the fake's prompt size is its word count)."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return ""
    return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def _completion_request(raw: bytes, default_tokens: int) -> tuple[Any, str, int]:
    """``(payload, prompt, max_tokens)`` of a completion request's body; a body that is not one (not
    JSON, not an object, a bad ``max_tokens``) has no prompt and the server's default tokens, the
    payload kept as far as it was decoded (a chat request reads its messages from it)."""
    payload: Any = None
    try:
        payload = json.loads(raw)
        return payload, str(payload.get("prompt", "")), int(payload.get("max_tokens") or default_tokens)
    except (ValueError, TypeError, AttributeError):
        return payload, "", default_tokens


def _completion_body(route: str, name: str, n: int, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The OpenAI answer to the server's ``n``-th completion: a chat completion on
    ``/v1/chat/completions``, a text completion otherwise, each " ok" per token, with ``usage``."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if route == "/v1/chat/completions":
        return {"id": f"chatcmpl-{name}-{n}", "object": "chat.completion",
                "created": int(time.time()), "model": FAKE_MODEL,
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": " ok" * completion_tokens}}],
                "usage": usage}
    return {"id": f"cmpl-{name}-{n}", "object": "text_completion",
            "created": int(time.time()), "model": FAKE_MODEL,
            "choices": [{"index": 0, "text": " ok" * completion_tokens, "finish_reason": "length"}],
            "usage": usage}


class _FakeHandler(BaseHTTPRequestHandler):
    """The HTTP side of a :class:`FakeInferenceServer` (``self.server.fake``): routes a request to the
    admin endpoints, the routes routers probe, or a completion."""

    protocol_version = "HTTP/1.1"
    server: _FakeHTTPServer

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        if self.path.startswith("/admin/"):
            self._admin(raw)
            return
        payload, prompt, max_tokens = _completion_request(raw, fake.completion_tokens)
        fake.count_hit(self.path, self.headers.get("User-Agent"))
        route = self.path.split("?", 1)[0]
        if route in _INFO_ROUTES:
            self._send_json(_info_body(route, fake.name))
            return
        if route == "/v1/chat/completions":
            prompt = _chat_prompt(payload if isinstance(payload, dict) else {})
        elif route != "/v1/completions":
            self.send_error(404)
            return
        prompt_tokens = max(1, len(prompt.split()))
        completion_tokens, extra = fake.generate(prompt_tokens, max_tokens)
        n = fake.count_completion()
        self._send_json(_completion_body(route, fake.name, n, prompt_tokens, completion_tokens), {
            "X-Served-By": fake.name,
            # What a tokens-aware sidecar would add; HAProxy captures them into its log line.
            "X-Prompt-Tokens": str(prompt_tokens), "X-Completion-Tokens": str(completion_tokens), **extra})

    do_GET = do_POST

    def _send_json(self, answer: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        """``200`` with ``answer`` as JSON, then ``headers`` in their order."""
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _admin(self, raw: bytes) -> None:
        """Test control: ``POST /admin/slowdown {"slowdown": x}``, ``GET /admin/stats``."""
        fake = self.server.fake
        if self.path == "/admin/slowdown" and self.command == "POST":
            try:
                fake.slowdown = float(json.loads(raw)["slowdown"])
            except (ValueError, KeyError, TypeError):
                self.send_error(400, "body must be {\"slowdown\": <number>}")
                return
        elif self.path != "/admin/stats":
            self.send_error(404)
            return
        self._send_json(fake.stats())

    def log_message(self, *args: Any) -> None:  # keep test output clean
        return


class _FakeHTTPServer(_QuietServer):
    """A loopback server on an ephemeral port whose handlers answer for ``fake``."""

    def __init__(self, fake: FakeInferenceServer) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", 0), _FakeHandler)


class FakeInferenceServer:
    """A tiny OpenAI-compatible completion server (see module docstring).

    Two timing modes:

    * fixed (default, ``per_token_ms=None``): every request sleeps ``base_delay_s * slowdown`` and
      reports ``completion_tokens`` tokens;
    * per token (``per_token_ms`` set): the request's ``max_tokens`` is honoured (that many tokens
      are "generated") and the server sleeps ``ttft = ttft_ms + prefill_ms_per_token * prompt``
      then ``per_token_ms * slowdown`` per output token, i.e. a gray node that is slow *per token*
      (what the detector's queue-free ``decode`` signal sees). ``X-TTFT-Ms`` reports the ttft, as a
      streaming-aware sidecar would, since a non-streaming response has no first-token timer.

    ``slowdown`` may be changed while serving (``heal()`` sets it to 1) to model a node that recovers.
    """

    def __init__(self, name: str, base_delay_s: float = 0.002, slowdown: float = 1.0,
                 completion_tokens: int = 16, *, per_token_ms: float | None = None,
                 ttft_ms: float = 5.0, prefill_ms_per_token: float = 0.2) -> None:
        self.name = name
        self.base_delay_s = base_delay_s
        self.slowdown = slowdown
        self.completion_tokens = completion_tokens
        self.per_token_ms = per_token_ms
        self.ttft_ms = ttft_ms
        self.prefill_ms_per_token = prefill_ms_per_token
        self.requests = 0
        self.paths: Counter[str] = Counter()
        self.user_agents: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.httpd = _FakeHTTPServer(self)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        # serve_forever polls for shutdown every poll_interval (0.5 s by default): stop() waited that
        # long per server, 2 s for a test's four.
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-{name}", daemon=True)
        self._thread.start()

    def count_hit(self, path: str, user_agent: str | None) -> None:
        """Count a request (any route) by path and by client."""
        with self._lock:
            self.paths[path] += 1
            # Canary probes come straight from the control plane (httpx), traffic via the gateway.
            self.user_agents[(user_agent or "-").split("/")[0]] += 1

    def generate(self, prompt_tokens: int, max_tokens: int) -> tuple[int, dict[str, str]]:
        """Take the time of one completion in the current timing mode (class docstring); returns its
        completion tokens and the extra headers (``X-TTFT-Ms`` in per-token mode)."""
        if self.per_token_ms is None:
            time.sleep(self.base_delay_s * self.slowdown)
            return self.completion_tokens, {}
        completion_tokens = max(1, min(max_tokens, 4096))
        started = time.perf_counter()
        time.sleep((self.ttft_ms + self.prefill_ms_per_token * prompt_tokens) / 1000.0)
        # The TTFT as measured (sleep overshoot belongs to prefill, not to decode).
        ttft = (time.perf_counter() - started) * 1000.0
        time.sleep(self.per_token_ms * self.slowdown * completion_tokens / 1000.0)
        return completion_tokens, {"X-TTFT-Ms": f"{ttft:.1f}"}

    def count_completion(self) -> int:
        """Count a completion served; returns its number (1 for the first)."""
        with self._lock:
            self.requests += 1
            return self.requests

    @property
    def delay_s(self) -> float:
        """Per-request delay in fixed mode."""
        return self.base_delay_s * self.slowdown

    def heal(self) -> None:
        """The gray failure is fixed: back to normal speed."""
        self.slowdown = 1.0

    def stats(self) -> dict[str, Any]:
        """Counters for tests: completions served, hits per path and per client (User-Agent)."""
        with self._lock:
            return {"name": self.name, "slowdown": self.slowdown, "requests": self.requests,
                    "paths": dict(self.paths), "user_agents": dict(self.user_agents)}

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RemoteFakeServer:
    """Handle on a ``FakeInferenceServer`` running in a ``FakeServerFleet`` process (admin endpoints)."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        host, _, port = self.address.partition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request(method, path, body=json.dumps(body or {}), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path} on {self.name}: HTTP {resp.status}")
        return json.loads(data)

    def set_slowdown(self, slowdown: float) -> None:
        self._call("POST", "/admin/slowdown", {"slowdown": slowdown})

    def heal(self) -> None:
        self.set_slowdown(1.0)

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/admin/stats")

    @property
    def user_agents(self) -> Counter[str]:
        return Counter(self.stats()["user_agents"])


class FakeServerFleet(_Process):
    """Fake inference servers in their own process: ``python -m harness.gateways``.

    Why a process: in the test process the servers' threads compete for the GIL with the traffic
    clients, the live ingest server and the shipper; a thread waking from ``sleep`` can wait a GIL
    switch interval (5 ms) and that lands in the decode time the detector judges, enough to make a
    healthy server look 15% slower for a moment. ``specs``: ``{name: {FakeInferenceServer kwargs}}``.
    ``servers`` maps each name to a :class:`RemoteFakeServer`.
    """

    def __init__(self, specs: dict[str, dict[str, Any]], *, timeout_s: float = 10.0) -> None:
        import sys

        self.workdir = Path(tempfile.gettempdir())
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.gateways", json.dumps(specs)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        ready: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        line = b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            line = self.proc.stdout.readline()
            if line:
                ready = json.loads(line)
                break
        if not ready:
            self.stop()
            raise RuntimeError(f"fake server fleet did not start: {line!r}")
        self.servers = {name: RemoteFakeServer(name, addr) for name, addr in ready.items()}


def _serve_fleet(specs: dict[str, dict[str, Any]]) -> None:
    """Entry point of :class:`FakeServerFleet`: start the servers, print ``{name: address}``, serve
    until stdin closes or SIGTERM."""
    import sys

    sys.setswitchinterval(0.0005)  # hand the GIL over quickly: sleeps end on time
    servers = {name: FakeInferenceServer(name, **kwargs) for name, kwargs in specs.items()}
    print(json.dumps({name: srv.address for name, srv in servers.items()}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    for srv in servers.values():
        srv.stop()


class SyslogCollector:
    """Receives HAProxy's UDP syslog datagrams on loopback and keeps the message lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="syslog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines.append(data.decode("utf-8", "replace").rstrip("\n"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


class HAProxyProcess(_Process):
    """A real HAProxy in front of ``servers`` (name -> "host:port"), in its own temp directory."""

    def __init__(self, workdir: Path, servers: dict[str, str], *, backend: str = "llm",
                 initial_weight: int = 256, log_port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.backend = backend
        self.port = free_port()
        self.socket_path = str(self.workdir / "admin.sock")
        self.config_path = self.workdir / "haproxy.cfg"
        log_line = f"    log 127.0.0.1:{log_port} local0 info\n" if log_port else ""
        server_lines = "".join(f"    server {name} {addr} weight {initial_weight}\n"
                               for name, addr in servers.items())
        self.config_path.write_text(
            "global\n"
            f"    stats socket {self.socket_path} mode 600 level admin\n"
            f"{log_line}"
            "defaults\n"
            "    mode http\n    log global\n    option httplog\n"
            "    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n"
            "frontend llm_in\n"
            f"    bind 127.0.0.1:{self.port}\n"
            "    capture response header X-Prompt-Tokens len 10\n"
            "    capture response header X-Completion-Tokens len 10\n"
            "    capture response header X-TTFT-Ms len 10\n"
            f"    default_backend {backend}\n"
            f"backend {backend}\n"
            "    balance roundrobin\n"
            f"{server_lines}"
        )
        check = subprocess.run([HAPROXY_BIN, "-c", "-q", "-f", str(self.config_path)], capture_output=True,
                               text=True, timeout=10, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c failed: {check.stderr}")
        # -db: stay in the foreground so the Popen pid is HAProxy itself.
        self.proc = subprocess.Popen([HAPROXY_BIN, "-db", "-f", str(self.config_path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Wait on the stats socket, not the HTTP port: a probe connection would be logged as <BADREQ>.
        deadline = time.monotonic() + 5
        while not os.path.exists(self.socket_path) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}")
            time.sleep(0.02)
        wait_for_socket(self.socket_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class NginxProcess(_Process):
    """A real nginx proxying to the upstream in ``include_path`` (which must already be valid)."""

    def __init__(self, workdir: Path, include_path: Path, upstream: str, *, access_log: Path | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config_path = self.workdir / "nginx.conf"
        self.error_log = self.workdir / "error.log"
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        temps = "".join(f"    {kind}_temp_path {tmp}/{kind};\n"
                        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        self.access_log = access_log
        access = "    access_log off;\n"
        if access_log is not None:
            # The ingress-nginx upstream format our nginx parser reads, plus token counts and TTFT
            # from the servers' response headers (see contract/logformats/nginx.py).
            access = (
                "    log_format outlier '$remote_addr - $remote_user [$time_local] \"$request\" $status "
                "$body_bytes_sent \"$http_referer\" \"$http_user_agent\" $request_length $request_time "
                f"[{upstream}] [] $upstream_addr $upstream_response_length $upstream_response_time "
                "$upstream_status $request_id prompt_tokens=$upstream_http_x_prompt_tokens "
                "completion_tokens=$upstream_http_x_completion_tokens ttft_ms=$upstream_http_x_ttft_ms';\n"
                f"    access_log {access_log} outlier;\n"
            )
        self.config_path.write_text(
            "worker_processes 1;\n"
            f"pid {self.workdir / 'nginx.pid'};\n"
            f"error_log {self.error_log} warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            f"{access}"
            f"{temps}"
            f"    include {include_path};\n"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port};\n"
            f"        location / {{ proxy_pass http://{upstream}; }}\n"
            "    }\n"
            "}\n"
        )
        self.base_cmd = [NGINX_BIN, "-p", str(self.workdir), "-c", str(self.config_path), "-e", str(self.error_log)]
        self.proc = subprocess.Popen([*self.base_cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def worker_pids(self) -> set[int]:
        """Pids of the master's live worker processes (from /proc)."""
        if self.proc is None:
            return set()
        pids = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                pids.add(int(entry))
        return pids

    def wait_reloaded(self, old_workers: set[int], timeout_s: float = 10.0) -> None:
        """Block until every worker from before a reload has exited and a new one runs: only then
        does all traffic follow the new upstream (reload is graceful and asynchronous)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.worker_pids()
            if now and not (now & old_workers):
                return
            time.sleep(0.02)
        raise TimeoutError(f"nginx workers {old_workers} still running after reload")

    @property
    def test_cmd(self) -> list[str]:
        return [*self.base_cmd, "-t", "-q"]

    @property
    def reload_cmd(self) -> list[str]:
        return [*self.base_cmd, "-s", "reload"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class TrafficResult:
    counts: Counter[str] = field(default_factory=Counter)
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def share(self, server: str) -> float:
        return self.counts[server] / self.total if self.total else 0.0


def send_traffic(url: str, n: int, *, timeout_s: float = 5.0, deadline_s: float = 30.0) -> TrafficResult:
    """``n`` sequential completions through the gateway at ``url`` (bounded by ``deadline_s``)."""
    host, _, port = url.removeprefix("http://").partition(":")
    result = TrafficResult()
    stop_at = time.monotonic() + deadline_s
    body = json.dumps({"model": "fake", "prompt": "hello gray failure world", "max_tokens": 16})
    for _ in range(n):
        if time.monotonic() > stop_at:
            break
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json", "Connection": "close"})
            resp = conn.getresponse()
            resp.read()
            served_by = resp.getheader("X-Served-By")
        except OSError:
            result.errors += 1
            continue
        finally:
            conn.close()
        if resp.status != 200 or not served_by:
            result.errors += 1
            continue
        result.counts[served_by] += 1
        result.latencies_ms[served_by].append((time.perf_counter() - t0) * 1000)
    return result


class TrafficLoop:
    """Background clients sending completions through a gateway until ``stop()`` or ``deadline_s``.

    ``clients`` threads, one connection per request (so each request is balanced on its own), with
    prompts of 2-40 words and ``max_tokens`` 8-32 drawn from a seeded RNG: varied sizes let the
    control plane fit its cost model. Every answered request is kept as ``(finished_at, server)``
    so a test can count each server's share in any time window (``counts_between``).
    """

    def __init__(self, url: str, *, clients: int = 4, deadline_s: float = 60.0, seed: int = 1,
                 timeout_s: float = 5.0) -> None:
        import random

        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.timeout_s = timeout_s
        self.served: list[tuple[float, str]] = []
        self.errors = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + deadline_s
        self._threads = [threading.Thread(target=self._loop, name=f"traffic-{i}", daemon=True)
                         for i in range(clients)]
        for t in self._threads:
            t.start()

    def _body(self) -> bytes:
        with self._lock:
            words = self._rng.randint(2, 40)
            max_tokens = self._rng.randint(8, 32)
        return json.dumps({"model": "fake", "prompt": " ".join(["tok"] * words), "max_tokens": max_tokens}).encode()

    def _loop(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                conn.request("POST", "/v1/completions", body=self._body(),
                             headers={"Content-Type": "application/json", "Connection": "close"})
                resp = conn.getresponse()
                resp.read()
                served_by = resp.getheader("X-Served-By")
                ok = resp.status == 200 and bool(served_by)
            except OSError:
                ok, served_by = False, None
            finally:
                conn.close()
            with self._lock:
                if ok and served_by:
                    self.served.append((time.time(), served_by))
                else:
                    self.errors += 1

    def counts_between(self, start: float, end: float | None = None) -> Counter[str]:
        """Requests per server that finished in ``[start, end)`` (wall-clock seconds)."""
        end = float("inf") if end is None else end
        with self._lock:
            return Counter(name for at, name in self.served if start <= at < end)

    def wait_requests(self, start: float, n: int, timeout_s: float = 20.0) -> Counter[str]:
        """Block until ``n`` requests finished after ``start``; returns their counts per server."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            counts = self.counts_between(start)
            if sum(counts.values()) >= n:
                return counts
            time.sleep(0.05)
        raise TimeoutError(f"only {sum(self.counts_between(start).values())} of {n} requests in {timeout_s}s")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 1)


class CeleryWorker(_Process):
    """``celery -A outlier_admin worker --beat`` (solo pool) with ``env`` (DATABASE_URL, REDIS_URL, ...)."""

    def __init__(self, workdir: Path, env: dict[str, str], *, cwd: Path | None = None,
                 loglevel: str = "WARNING") -> None:
        import sys

        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "celery.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "outlier_admin", "worker", "--beat", "--pool", "solo",
             "--loglevel", loglevel, "-s", str(self.workdir / "beat-schedule")],
            cwd=cwd, env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        super().stop()
        self._log.close()


#: The harness's documents stay fresh for a minute: a test that publishes once and then watches a
#: gateway for longer than the control plane's 30 s (:data:`DEFAULT_STALE_AFTER_S`) must not see its
#: own document go stale and fail open half-way.
HARNESS_STALE_AFTER_S = 60.0


def weights_document(group: str, version: int, servers: dict[str, str], *, quarantined: tuple[str, ...] = (),
                     weights: dict[str, int] | None = None, generated_at: float | None = None,
                     stale_after_s: float = HARNESS_STALE_AFTER_S, safeguard: bool = False) -> dict[str, Any]:
    """A weights document in the control plane's contract (for tests and the benchmarks), built by
    the publisher's own type (:meth:`WeightsDocument.build`): every node at its base weight, the
    ``quarantined`` ones at 0, ``weights`` pinned."""
    weights = weights or {}
    nodes = []
    for name, addr in servers.items():
        q = name in quarantined
        nodes.append({"node": name, "address": addr, "weight": 0 if q else weights.get(name, DEFAULT_BASE_WEIGHT),
                      "state": "quarantined" if q else "healthy", "base_weight": DEFAULT_BASE_WEIGHT})
    doc = WeightsDocument.build(group, version, nodes, safeguard=safeguard,
                                now=time.time() if generated_at is None else generated_at,
                                stale_after_s=stale_after_s)
    return doc.to_dict()


def publish(redis_client: Any, doc: dict[str, Any]) -> None:
    """Write the document and notify, as the control plane does on a single Redis
    (:func:`outlier_admin.control.publish.queue_document`): the versioned key, the legacy key for one
    release, the legacy channel."""
    body = json.dumps(doc)
    pipe = redis_client.pipeline(transaction=True)
    pipe.set(keys.weights(doc["group"]), body)
    pipe.set(keys.legacy_weights(doc["group"]), body)
    pipe.publish(keys.LEGACY_WEIGHTS_CHANNEL, json.dumps({"group": doc["group"], "version": doc["version"]}))
    pipe.execute()


def run_agent(agent: Any, *, resync_interval_s: float = 60.0) -> tuple[threading.Event, threading.Thread]:
    """``agent.run`` (an :class:`agent.core.Agent`) in a daemon thread; set the event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), kwargs={"resync_interval_s": resync_interval_s},
                              daemon=True)
    thread.start()
    return stop, thread


def wait_version(agent: Any, version: int, timeout: float = 5.0) -> None:
    """Block until ``agent`` has applied ``version`` without error (AssertionError after ``timeout``)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if agent.state.version == version and agent.state.last_error == "":
            return
        time.sleep(0.01)
    raise AssertionError(f"agent did not apply version {version}: {agent.state}")


def make_workdir(prefix: str = "oa-gw-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


if __name__ == "__main__":
    import sys

    _serve_fleet(json.loads(sys.argv[1]))
