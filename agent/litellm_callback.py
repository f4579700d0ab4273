"""LiteLLM proxy: the weights applied by a callback LiteLLM calls before it picks a deployment.

LiteLLM's router asks every callback that is a ``CustomLogger`` to filter the deployments it may
pick from (``CustomLogger.async_filter_deployments(model, healthy_deployments, messages,
request_kwargs, parent_otel_span)``, called by ``Router.async_callback_filter_deployments`` after
its own health-check and cooldown filters and before its routing strategy chooses; litellm 1.108).
This module's :data:`outlier_filter` is such a callback. In the proxy's YAML::

    model_list:
      - model_name: llama-70b                    # the model group: one deployment per node
        litellm_params: {model: openai/llama-70b, api_base: http://10.0.0.7:8000/v1, api_key: none}
      - model_name: llama-70b
        litellm_params: {model: openai/llama-70b, api_base: http://10.0.0.8:8000/v1, api_key: none}
    litellm_settings:
      callbacks: ["agent.litellm_callback.outlier_filter"]
    environment_variables:
      OUTLIER_LITELLM_REDIS_URL: redis://cp-redis:6379/0
      OUTLIER_LITELLM_GROUPS: "llama-70b=llama-70b"   # LiteLLM model name = outlier-admin group

with the gateway agent's distribution installed beside LiteLLM (``pip install outlier-admin-agent``):
this module imports LiteLLM and the agent's own modules, nothing of Django.

Per request, for a model that maps to a group:

* a deployment whose ``api_base`` host:port is a **quarantined** node is dropped;
* a **degraded** node's deployment is kept with probability ``weight / base_weight`` (sampled per
  request), so it gets fewer requests the lower its weight, whatever routing strategy LiteLLM then
  applies to what is left. Under an even strategy (``simple-shuffle``) over ``n`` deployments a node
  at fraction ``f`` of its base weight gets ``f / n`` of the traffic when the others are full: not
  exactly ``f / (n - 1 + f)`` (proportional), close to it for the small cuts that matter;
* a deployment no node names is left alone; a node no deployment names is reported (``missing``);
* what is left is never empty: when sampling dropped every deployment that is not quarantined, one of
  them is drawn by weight; when every deployment is quarantined, all are returned (LiteLLM would
  otherwise fail the request).

The document never costs a request a Redis round trip: each group's :class:`GatewayClient` runs in
a daemon thread (started at the group's first request, which waits for its first read: one ``GET``,
at most 0.5 s) that pulls on every change notification and at least every
``OUTLIER_LITELLM_POLL_INTERVAL`` seconds (1 s), and a request reads the last good document from
memory. Fail static, then fail open, exactly as the agent: Redis down keeps the last
good document until it is ``stale_after_s`` old, then every deployment is back; with no document yet
nothing is filtered.

Metrics (:class:`FilterCollector`, on prometheus-client's default registry, served by LiteLLM's
``/metrics`` when its ``prometheus`` callback is on): requests judged, deployments dropped (by reason),
nodes no deployment names, fail-open and the document's age, per group.

Settings (environment, read at the first request, so the YAML's ``environment_variables`` apply):
``OUTLIER_LITELLM_REDIS_URL`` (else ``OUTLIER_AGENT_REDIS_URL``, ``REDIS_URL``),
``OUTLIER_LITELLM_GROUPS`` (``model=group,...``; unset: each model name is its own group),
``OUTLIER_LITELLM_POLL_INTERVAL`` (seconds, 0.2..60), ``OUTLIER_LITELLM_KEY_PREFIX`` and
``OUTLIER_LITELLM_CHANNEL`` (the agent's ``--key-prefix`` / ``--channel``),
``OUTLIER_LITELLM_LOG_LEVEL`` (this module's log on stderr, e.g. ``INFO``; ``DEBUG`` logs every
request's choice).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.client import (
    CHANNEL,
    KEY_PREFIX,
    MODE_FAIL_OPEN,
    EffectiveWeights,
    GatewayClient,
    NodeWeight,
    RedisURLError,
    redis_from_url,
)
from agent.worker_set import worker_address
from contract.names import GROUP_NAME_RE

log = logging.getLogger("agent.litellm")

DEFAULT_POLL_INTERVAL_S = 1.0
#: Seconds a Redis connect or read may take (the watcher's; a group's first request waits for one).
REDIS_TIMEOUT_S = 0.5


def parse_groups(text: str) -> dict[str, str]:
    """``"llama=llama-70b, qwen=qwen-7b"`` -> ``{"llama": "llama-70b", "qwen": "qwen-7b"}``; raises
    ValueError naming the bad entry (a group name the control plane would refuse)."""
    out: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        model, sep, group = (p.strip() for p in entry.partition("="))
        if not sep or not model or not GROUP_NAME_RE.fullmatch(group):
            raise ValueError(f"OUTLIER_LITELLM_GROUPS entry {entry!r} is not model=group")
        out[model] = group
    return out


def deployment_address(deployment: Any) -> str | None:
    """The ``host:port`` of a deployment's ``api_base`` (None without one)."""
    if not isinstance(deployment, dict):
        return None
    params = deployment.get("litellm_params")
    api_base = params.get("api_base") if isinstance(params, dict) else None
    if not isinstance(api_base, str) or not api_base:
        return None
    try:
        return worker_address(api_base)
    except ValueError:
        return None


@dataclass
class FilterStats:
    """What the filter did, per group (logged and exported as metrics)."""

    requests: Counter[str] = field(default_factory=Counter)
    dropped_quarantined: Counter[str] = field(default_factory=Counter)
    dropped_degraded: Counter[str] = field(default_factory=Counter)
    all_quarantined: Counter[str] = field(default_factory=Counter)
    missing: dict[str, list[str]] = field(default_factory=dict)


def filter_deployments(deployments: list[Any], weights: EffectiveWeights | None, rng: random.Random,
                       stats: FilterStats | None = None) -> list[Any]:
    """The deployments LiteLLM may pick from for one request (module docstring); pure but for ``rng``."""
    if weights is None or not deployments:
        return deployments
    stats = stats if stats is not None else FilterStats()
    group = weights.group
    by_addr: dict[str, NodeWeight] = {n.address: n for n in weights.nodes}
    kept: list[Any] = []
    eligible: list[tuple[Any, NodeWeight]] = []  # in service, kept or not by the sampling
    seen: set[str] = set()
    for deployment in deployments:
        addr = deployment_address(deployment)
        node = by_addr.get(addr) if addr else None
        if node is None:  # no node names it: not ours to judge
            kept.append(deployment)
            continue
        seen.add(node.address)
        if node.quarantined:
            stats.dropped_quarantined[group] += 1
            continue
        eligible.append((deployment, node))
        if node.weight >= node.base_weight or rng.random() * node.base_weight < node.weight:
            kept.append(deployment)
        else:
            stats.dropped_degraded[group] += 1
    missing = sorted(f"{n.node} ({n.address})" for n in weights.nodes if n.address not in seen)
    if missing != stats.missing.get(group, []):
        if missing:
            log.warning("nodes of group %s with no LiteLLM deployment (api_base): %s", group, ", ".join(missing))
        stats.missing[group] = missing
    stats.requests[group] += 1
    if kept:
        return kept
    if eligible:  # sampling dropped them all: one of them, drawn by weight
        pick = rng.random() * sum(n.weight for _, n in eligible)
        for deployment, node in eligible:
            pick -= node.weight
            if pick < 0:
                return [deployment]
        return [eligible[-1][0]]
    stats.all_quarantined[group] += 1
    return deployments  # every deployment quarantined: never leave LiteLLM with none


class FilterCollector:
    """Prometheus metrics of a :class:`DeploymentFilter`, read at scrape time (labels ``group``):
    ``outlier_litellm_requests_total``, ``outlier_litellm_dropped_total{reason}`` (quarantined,
    degraded), ``outlier_litellm_all_quarantined_total``, ``outlier_litellm_missing_nodes`` (nodes no
    deployment names), ``outlier_litellm_fail_open`` and ``outlier_litellm_weights_age_seconds``.
    Registered on prometheus-client's default registry, which LiteLLM's ``/metrics`` serves when its
    ``prometheus`` callback is on."""

    def __init__(self, deployment_filter: DeploymentFilter) -> None:
        self.filter = deployment_filter

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.filter.stats
        requests = CounterMetricFamily("outlier_litellm_requests", "Requests the outlier-admin filter judged.",
                                       labels=["group"])
        dropped = CounterMetricFamily("outlier_litellm_dropped", "Deployments taken out of a request's choice.",
                                      labels=["group", "reason"])
        everything = CounterMetricFamily("outlier_litellm_all_quarantined",
                                         "Requests whose every deployment was quarantined (none dropped).",
                                         labels=["group"])
        missing = GaugeMetricFamily("outlier_litellm_missing_nodes", "Nodes of the group no deployment names.",
                                    labels=["group"])
        fail_open = GaugeMetricFamily("outlier_litellm_fail_open", "1 while the group's document is stale.",
                                      labels=["group"])
        age = GaugeMetricFamily("outlier_litellm_weights_age_seconds",
                                "Seconds since the group's last good document was generated.", labels=["group"])
        for group, client in sorted(self.filter.clients().items()):
            requests.add_metric([group], stats.requests[group])
            dropped.add_metric([group, "quarantined"], stats.dropped_quarantined[group])
            dropped.add_metric([group, "degraded"], stats.dropped_degraded[group])
            everything.add_metric([group], stats.all_quarantined[group])
            missing.add_metric([group], len(stats.missing.get(group, [])))
            eff = client.effective()
            if eff is not None:
                fail_open.add_metric([group], 1.0 if eff.mode == MODE_FAIL_OPEN else 0.0)
                age.add_metric([group], eff.age_s)
        yield from (requests, dropped, everything, missing, fail_open, age)


class DeploymentFilter:
    """One watcher thread per group, started at its first request; :meth:`filter` reads memory only."""

    def __init__(self, *, redis_url: str | None = None, groups: dict[str, str] | None = None,
                 poll_interval_s: float | None = None, key_prefix: str | None = None, channel: str | None = None,
                 rng: random.Random | None = None,
                 client_factory: Callable[[str, str], GatewayClient] | None = None,
                 register_metrics: bool = False) -> None:
        self._settings = {"redis_url": redis_url, "groups": groups, "poll_interval_s": poll_interval_s,
                          "key_prefix": key_prefix, "channel": channel}
        self.rng = rng or random.Random()
        self.stats = FilterStats()
        self._client_factory = client_factory
        self._clients: dict[str, GatewayClient | None] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._configured = False
        self._register_metrics = register_metrics

    def _configure(self) -> None:
        """Read the settings (arguments, else the environment) once, at the first request."""
        env = os.environ.get
        s = self._settings
        self.redis_url = (s["redis_url"] or env("OUTLIER_LITELLM_REDIS_URL") or env("OUTLIER_AGENT_REDIS_URL")
                          or env("REDIS_URL") or "redis://127.0.0.1:6379/0")
        groups = s["groups"]
        if groups is None:
            try:
                groups = parse_groups(env("OUTLIER_LITELLM_GROUPS", ""))
            except ValueError as exc:
                log.error("%s: outlier-admin filters nothing until it is fixed", exc)
                groups = {}
            self._identity = not env("OUTLIER_LITELLM_GROUPS")
        else:
            self._identity = False
        self.groups = groups
        try:
            poll = float(s["poll_interval_s"] or env("OUTLIER_LITELLM_POLL_INTERVAL") or DEFAULT_POLL_INTERVAL_S)
        except ValueError:
            poll = DEFAULT_POLL_INTERVAL_S
        self.poll_interval_s = min(60.0, max(0.2, poll))
        self.key_prefix = s["key_prefix"] or env("OUTLIER_LITELLM_KEY_PREFIX") or KEY_PREFIX
        self.channel = s["channel"] or env("OUTLIER_LITELLM_CHANNEL") or CHANNEL
        level = env("OUTLIER_LITELLM_LOG_LEVEL")
        if level and not log.handlers:  # LiteLLM configures its own loggers only
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            log.addHandler(handler)
            log.setLevel(level.upper())
        if self._register_metrics:
            try:
                self.register_metrics()
            except ValueError as exc:  # already registered (a second filter in one process)
                log.warning("outlier-admin: metrics not registered: %s", exc)
        self._configured = True

    def group_of(self, model: str) -> str | None:
        """The outlier-admin group of a LiteLLM model name (None: not filtered)."""
        group = self.groups.get(model)
        if group is None and self._identity and isinstance(model, str) and GROUP_NAME_RE.fullmatch(model):
            group = model
        return group

    def client(self, group: str) -> GatewayClient | None:
        """The group's client, its watcher thread started on first use (None if it cannot be made)."""
        client = self._clients.get(group, ...)
        if client is not ...:
            return client
        with self._lock:
            if group in self._clients:
                return self._clients[group]
            made: GatewayClient | None
            try:
                if self._client_factory is not None:
                    made = self._client_factory(group, self.redis_url)
                else:
                    conn = redis_from_url(self.redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                          socket_connect_timeout=REDIS_TIMEOUT_S)
                    made = GatewayClient(conn, group, key_prefix=self.key_prefix, channel=self.channel,
                                         poll_interval_s=self.poll_interval_s)
            except (RedisURLError, OSError, ValueError) as exc:  # a bad URL; a cluster with no node reachable
                log.error("outlier-admin: cannot watch group %s at %s: %s (not filtering it)", group,
                          self.redis_url, exc)
                made = None
            if made is not None:
                # The group's first request waits for one read (<= REDIS_TIMEOUT_S, once), so a node
                # quarantined before the proxy started gets no request at all; never again after.
                made.refresh()
                doc = made.document
                log.info("outlier-admin: watching the weights of group %s at %s (version %s now)", group,
                         self.redis_url, None if doc is None else doc.version)
                thread = threading.Thread(target=made.run, args=(lambda _w: None, self._stop),
                                          name=f"outlier-weights-{group}", daemon=True)
                thread.start()
            self._clients[group] = made
            return made

    def weights(self, model: str) -> EffectiveWeights | None:
        """The weights in force for ``model`` now (None: nothing to apply)."""
        if not self._configured:
            with self._lock:
                if not self._configured:
                    self._configure()
        group = self.group_of(model)
        if group is None:
            return None
        client = self.client(group)
        return None if client is None else client.effective()

    def filter(self, model: str, deployments: list[Any]) -> list[Any]:
        """What :meth:`OutlierFilter.async_filter_deployments` returns. Never raises: a bug here must
        not fail a request, so any error passes the deployments through unchanged (logged)."""
        try:
            weights = self.weights(model)
            kept = filter_deployments(deployments, weights, self.rng, self.stats)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("model %s: %s of %d deployments kept (weights %s)", model,
                          [deployment_address(d) for d in kept], len(deployments),
                          None if weights is None else
                          f"v{weights.version} {weights.mode} " + " ".join(f"{n.address}={n.weight}" for n in weights.nodes))
            return kept
        except Exception:  # fail open: the request goes on with LiteLLM's own choice
            log.exception("outlier-admin filter failed for model %s; not filtering", model)
            return deployments

    def clients(self) -> dict[str, GatewayClient]:
        """The groups watched so far and their clients."""
        return {g: c for g, c in list(self._clients.items()) if c is not None}

    def register_metrics(self, registry: Any = None) -> bool:
        """Export :class:`FilterCollector` on ``registry`` (prometheus-client's default one when None);
        False without prometheus-client."""
        try:
            from prometheus_client import REGISTRY
        except ImportError:
            return False
        (registry or REGISTRY).register(FilterCollector(self))
        return True

    def close(self) -> None:
        """Stop the watcher threads (they are daemons; for tests and a clean shutdown)."""
        self._stop.set()


try:  # the callback is a CustomLogger only where LiteLLM is installed (the proxy's venv)
    from litellm.integrations.custom_logger import CustomLogger as _CustomLogger
except ImportError:  # the agent's own venv: the filter above is still importable and testable
    _CustomLogger = object  # type: ignore[assignment,misc]


class OutlierFilter(_CustomLogger):  # type: ignore[misc,valid-type]
    """The LiteLLM callback (``litellm_settings: callbacks: [...outlier_filter]``)."""

    def __init__(self, deployment_filter: DeploymentFilter | None = None, **kwargs: Any) -> None:
        if _CustomLogger is not object:
            super().__init__(**kwargs)
        self.deployment_filter = deployment_filter or DeploymentFilter(register_metrics=True)

    async def async_filter_deployments(self, model: str, healthy_deployments: list, messages: Any,
                                       request_kwargs: dict | None = None, parent_otel_span: Any = None) -> list:
        if not isinstance(healthy_deployments, list):
            return healthy_deployments
        return self.deployment_filter.filter(model, healthy_deployments)


#: The instance the proxy's YAML names; nothing is read or connected before the first request.
outlier_filter = OutlierFilter()
