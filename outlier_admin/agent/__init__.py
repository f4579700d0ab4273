"""Gateway agent: puts the published weights into HAProxy, nginx, Envoy, Traefik or Caddy on the gateway host.

Plain Python (redis-py only; prometheus-client optional): no Django import anywhere in this package,
so it runs on a gateway host without the control plane installed — from the distribution
``outlier-admin-agent`` (``deploy/agent``), which ships this package but ``bench``, ``bench_e2e`` and
``harness``. Run it with ``outlier-agent --help`` (or ``python -m outlier_admin.agent --help``); see
``outlier_admin/agent/README.md``.

Modules: ``core`` (the apply loop around ``outlier_admin.gateway_client``), one applier per gateway
(``haproxy``, ``nginx``, ``envoy``, ``traefik``, ``caddy``; ``adminapi`` is the routers' admin-API
client with retries), ``metrics`` (``outlier_agent_*``), ``harness`` (fake inference
servers and per-test HAProxy/nginx processes for the end-to-end tests and the benchmark), ``bench``.
"""
