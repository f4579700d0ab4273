"""``python -m agent``: run the gateway agent (see agent/README.md).

Every option also reads an environment variable (``OUTLIER_AGENT_<OPTION>``, e.g.
``OUTLIER_AGENT_GROUP``); the Redis URL falls back to ``REDIS_URL``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

import redis

from agent.adminapi import check_base_url
from agent.base import Applier, ApplyError
from agent.caddy import DEFAULT_FULL_WEIGHT, CaddyApplier
from agent.client import CHANNEL, KEY_PREFIX, GatewayClient
from agent.core import Agent
from agent.envoy import EnvoyApplier
from agent.haproxy import HAProxyApplier
from agent.metrics import start_metrics_server
from agent.nginx import NginxApplier, check_directive, upstream_name_for
from agent.smg import SmgApplier
from agent.traefik import TraefikApplier
from agent.vllm_router import VllmRouterApplier
from contract.topology import RedisURLError

#: The gateways ``--gateway`` drives (docs/gateways.md has a configuration for each).
GATEWAYS = ("haproxy", "nginx", "envoy", "traefik", "caddy", "smg", "vllm-router")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"OUTLIER_AGENT_{name.upper().replace('-', '_')}", default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", choices=GATEWAYS, default=_env("gateway"),
                   help="which local gateway to drive")
    p.add_argument("--group", default=_env("group"), help="model group whose weights to apply")
    p.add_argument("--redis-url", default=_env("redis_url", os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")))
    p.add_argument("--key-prefix", default=_env("key_prefix", KEY_PREFIX))
    p.add_argument("--channel", default=_env("channel", CHANNEL))
    p.add_argument("--poll-interval", type=float, default=float(_env("poll_interval", "5")),
                   help="seconds between pulls when no notification arrives (default 5)")
    p.add_argument("--resync-interval", type=float, default=float(_env("resync_interval", "30")),
                   help="re-apply unchanged weights this often to repair a restarted gateway (default 30)")
    p.add_argument("--metrics-port", type=int, default=int(_env("metrics_port", "0")),
                   help="serve Prometheus metrics on this port (0 = off)")
    p.add_argument("--metrics-addr", default=_env("metrics_addr", "127.0.0.1"))
    p.add_argument("--status-file", default=_env("status_file"),
                   help="JSON status (version, mode, safeguard, ...) for local admission control")
    p.add_argument("--once", action="store_true", help="pull, apply once and exit (exit 1 on failure)")
    p.add_argument("--gateway-id", default=_env("gateway_id"),
                   help="this gateway's name in the applied-versions report the dashboard shows (default host/kind)")
    p.add_argument("--log-level", default=_env("log_level", "INFO"))
    h = p.add_argument_group("HAProxy")
    h.add_argument("--haproxy-socket", default=_env("haproxy_socket", "/run/haproxy/admin.sock"),
                   help="runtime API: UNIX socket path or host:port (needs 'level admin')")
    h.add_argument("--haproxy-backend", default=_env("haproxy_backend"), help="backend holding the group's servers")
    h.add_argument("--haproxy-full-weight", type=int, default=int(_env("haproxy_full_weight", "256")),
                   help="HAProxy weight of a node at its base weight (1..256, default 256)")
    n = p.add_argument_group("nginx")
    n.add_argument("--nginx-include", default=_env("nginx_include"), help="upstream include file to render")
    n.add_argument("--nginx-upstream", default=_env("nginx_upstream"), help="upstream name (default outlier_<group>)")
    n.add_argument("--nginx-test-cmd", default=_env("nginx_test_cmd", "nginx -t -q"))
    n.add_argument("--nginx-reload-cmd", default=_env("nginx_reload_cmd", "nginx -s reload"))
    n.add_argument("--nginx-server-params", default=_env("nginx_server_params", ""),
                   help="extra parameters on every server line, e.g. 'max_fails=0'")
    n.add_argument("--nginx-directive", action="append", dest="nginx_directives", metavar="DIRECTIVE",
                   default=None,
                   help="a directive of the rendered upstream block, repeatable: e.g. 'least_conn', "
                        "'keepalive 32' (env OUTLIER_AGENT_NGINX_DIRECTIVES: ';'-separated)")
    e = p.add_argument_group("Envoy")
    e.add_argument("--envoy-eds-path", default=_env("envoy_eds_path"), help="EDS file the cluster watches")
    e.add_argument("--envoy-cluster", default=_env("envoy_cluster"), help="cluster_name (default: the group)")
    e.add_argument("--envoy-admin-url", default=_env("envoy_admin_url"),
                   help="Envoy's admin interface (http://127.0.0.1:9901): confirm every apply on /clusters")
    t = p.add_argument_group("Traefik")
    t.add_argument("--traefik-file", default=_env("traefik_file"),
                   help="the agent's file in the file provider's directory (JSON in a .yaml file)")
    t.add_argument("--traefik-service", default=_env("traefik_service"), help="service name (default: the group)")
    t.add_argument("--traefik-api-url", default=_env("traefik_api_url"),
                   help="Traefik's API (http://127.0.0.1:8080): confirm every apply on /api/http/services")
    c = p.add_argument_group("Caddy")
    c.add_argument("--caddy-admin-url", default=_env("caddy_admin_url", "http://127.0.0.1:2019"),
                   help="Caddy's admin endpoint (default http://127.0.0.1:2019)")
    c.add_argument("--caddy-handler-id", default=_env("caddy_handler_id"),
                   help="the '@id' of the group's reverse_proxy handler")
    c.add_argument("--caddy-full-weight", type=int, default=int(_env("caddy_full_weight", str(DEFAULT_FULL_WEIGHT))),
                   help="weighted_round_robin weight of a node at its base weight (1..100, default 10)")
    r = p.add_argument_group("SGLang Model Gateway (smg) and vLLM router (vllm-router): their worker API")
    r.add_argument("--router-url", default=_env("router_url"),
                   help="the router's base URL, e.g. http://127.0.0.1:30000 (its admin routes)")
    r.add_argument("--router-workers", nargs="*", default=None, metavar="URL",
                   help="worker URLs the agent may register again after a removal: the router's --worker-urls "
                        "(env OUTLIER_AGENT_ROUTER_WORKERS, space-separated). A document node outside these "
                        "and the router's own list is skipped")
    r.add_argument("--router-api-key", default=_env("router_api_key"),
                   help="bearer token for the router's admin routes (its --api-key), if it has one")
    r.add_argument("--router-remove-below", type=float, default=float(_env("router_remove_below", "0")),
                   help="also remove a node whose weight is below this fraction of its base weight (0..1; "
                        "default 0: only quarantined nodes are removed; these routers have no weights)")
    return p


def nginx_directives(given: Sequence[str] | None) -> list[str]:
    """The upstream directives: the repeated ``--nginx-directive`` values, else the environment's
    ``OUTLIER_AGENT_NGINX_DIRECTIVES`` split on ``;`` (one variable cannot repeat). Each is checked by
    :func:`agent.nginx.check_directive`; a bad one stops the agent before it writes."""
    if given is None:
        given = [d for d in (_env("nginx_directives", "") or "").split(";") if d.strip()]
    try:
        return [check_directive(d) for d in given]
    except ValueError as exc:
        raise SystemExit(f"--nginx-directive: {exc}") from None


def build_applier(args: argparse.Namespace) -> Applier:
    """The applier for ``args.gateway``; raises SystemExit with a clear message on missing options."""
    if args.gateway == "haproxy":
        if not args.haproxy_backend:
            raise SystemExit("--haproxy-backend is required for --gateway haproxy")
        return HAProxyApplier(args.haproxy_socket, args.haproxy_backend, args.haproxy_full_weight)
    if args.gateway == "nginx":
        if not args.nginx_include:
            raise SystemExit("--nginx-include is required for --gateway nginx")
        return NginxApplier(args.nginx_include, args.nginx_upstream or upstream_name_for(args.group),
                            test_cmd=shlex.split(args.nginx_test_cmd),
                            reload_cmd=shlex.split(args.nginx_reload_cmd),
                            server_params=args.nginx_server_params,
                            directives=nginx_directives(args.nginx_directives))
    if args.gateway == "envoy":
        if not args.envoy_eds_path:
            raise SystemExit("--envoy-eds-path is required for --gateway envoy")
        return EnvoyApplier(args.envoy_eds_path, args.envoy_cluster or args.group,
                            admin_url=_checked_url(args.envoy_admin_url, "--envoy-admin-url"))
    if args.gateway == "traefik":
        if not args.traefik_file:
            raise SystemExit("--traefik-file is required for --gateway traefik (the agent's file in the "
                             "file provider's directory; docs/gateways.md)")
        try:
            return TraefikApplier(args.traefik_file, args.traefik_service or args.group,
                                  api_url=_checked_url(args.traefik_api_url, "--traefik-api-url"))
        except ValueError as exc:
            raise SystemExit(f"--traefik-file: {exc}") from None
    if args.gateway == "caddy":
        if not args.caddy_handler_id:
            raise SystemExit("--caddy-handler-id is required for --gateway caddy (the '@id' of the group's "
                             "reverse_proxy handler; docs/gateways.md)")
        try:
            return CaddyApplier(_checked_url(args.caddy_admin_url, "--caddy-admin-url") or "", args.caddy_handler_id,
                                full_weight=args.caddy_full_weight)
        except ValueError as exc:
            raise SystemExit(f"--gateway caddy: {exc}") from None
    if args.gateway in ("smg", "vllm-router"):
        router_url = _checked_url(args.router_url, "--router-url")
        if not router_url:
            raise SystemExit(f"--router-url is required for --gateway {args.gateway} (docs/gateways.md)")
        workers = args.router_workers
        if workers is None:
            workers = (_env("router_workers", "") or "").split()
        cls = SmgApplier if args.gateway == "smg" else VllmRouterApplier
        try:
            return cls(router_url, api_key=args.router_api_key, router_workers=workers,
                       remove_below=args.router_remove_below)
        except ValueError as exc:
            raise SystemExit(f"--gateway {args.gateway}: {exc}") from None
    raise SystemExit(f"--gateway is required ({', '.join(GATEWAYS)})")


def _checked_url(url: str | None, option: str) -> str | None:
    """An admin/API base URL from the command line, or SystemExit saying what is wrong with it."""
    if not url:
        return None
    try:
        return check_base_url(url, option)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.group:
        raise SystemExit("--group is required")
    applier = build_applier(args)
    try:
        client = GatewayClient.from_url(args.redis_url, args.group, key_prefix=args.key_prefix,
                                        channel=args.channel, poll_interval_s=args.poll_interval)
    except (RedisURLError, redis.ConnectionError) as exc:  # a bad URL; a cluster with no node reachable
        raise SystemExit(f"--redis-url: {exc}") from None
    agent = Agent(client, applier, status_file=args.status_file, gateway_id=args.gateway_id)
    if args.once:
        try:
            return 0 if agent.run_once() else 1
        except ApplyError:
            return 1
    if args.metrics_port:
        start_metrics_server(agent, args.metrics_port, args.metrics_addr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    agent.run(stop, resync_interval_s=args.resync_interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
