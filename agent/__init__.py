"""Gateway agent: puts the published weights into HAProxy, nginx, Envoy, Traefik, Caddy, SGLang Model
Gateway or vLLM router on the gateway host, and into LiteLLM through a callback the proxy loads.

Plain Python (redis-py only; prometheus-client optional): no Django import anywhere in this package,
nor in :mod:`contract`, the only other package it imports, so it runs on a gateway host without the
control plane installed — from the distribution ``outlier-admin-agent`` (``deploy/agent``: this
package and ``contract``). Run it with ``outlier-agent --help`` (or ``python -m agent --help``); see
``agent/README.md``.

Modules: ``client`` (the gateway client: reads and checks the weights document, fail static then fail
open), ``core`` (the apply loop around it), one applier per gateway (``haproxy``, ``nginx``,
``envoy``, ``traefik``, ``caddy``, ``smg`` and ``vllm_router`` (over ``worker_set``: routers whose
worker list is all there is to change); ``adminapi``: the routers' admin-API client, with retries),
``litellm_callback`` (LiteLLM's deployment filter, loaded by the proxy, no agent process),
``metrics`` (``outlier_agent_*``), ``shipper`` (access logs to the control plane).
"""
