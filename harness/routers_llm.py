"""The LLM-native routers, started the way their users run them: SGLang Model Gateway (``smg``),
vLLM router (``vllm-router``) and the LiteLLM proxy, each in front of given backends, with or without
the slow-backend defence its own documentation recommends. Used by the end-to-end tests of the
agent's appliers (``tests/agent/test_e2e_llm_routers.py``, ``tests/agent/test_e2e_litellm.py``) and by the drill.

>>> router = start_router("smg", {"a": "127.0.0.1:8001", "b": "127.0.0.1:8002"}, make_workdir())
>>> router.url                      # OpenAI-compatible entry point (/v1/chat/completions, /v1/completions)
>>> router.agent_args()             # the agent's --gateway options that drive this router
>>> router.stop()

Every router binds 127.0.0.1 on a free port, lives in its own temp directory (config, log) and is
stopped by pid. ``backends`` maps a node name to ``host:port`` (the weights document's address).

The defence (``defence=True``), setting by setting, and where each comes from
------------------------------------------------------------------------------

SGLang Model Gateway 1.13 (``smg launch``; flags from ``smg launch --help`` of the installed wheel):

* ``--policy power_of_two``: sample two workers, send to the less loaded one; the docs' choice for
  "heterogeneous workers with varying response times" when cache locality does not matter
  (smg-docs ``concepts/routing/load-balancing.md``, "Power of Two Choices").
* ``--cb-failure-threshold 3 --cb-success-threshold 2 --cb-timeout-duration-secs 10``: the
  per-worker circuit breaker opens after 3 consecutive failures (it counts errors, never latency)
  and half-opens after 10 s (smg-docs ``concepts/reliability/circuit-breakers.md``; the defaults
  are 10 failures / 60 s, tightened as that page suggests for latency-sensitive serving).
* ``--health-check-interval-secs 5 --health-failure-threshold 3 --health-success-threshold 2``:
  active ``/health`` probes every 5 s (default 60) take a worker out of rotation after 3 failures
  (smg-docs ``concepts/reliability/health-checks.md``).
* ``--retry-max-retries 2``: a failed request is retried on another worker (smg-docs
  ``concepts/reliability/retries.md``; default 5).

vLLM router 0.1.17 (``vllm-router``; a fork of the SGLang router with the same flags, from
``vllm-router --help``; vllm-project/router ``README.md`` and ``src/config/types.rs``):

* ``--policy power_of_two`` (in-flight requests; it refuses to start with fewer than two workers),
* ``--cb-failure-threshold 3 --cb-success-threshold 2 --cb-timeout-duration-secs 10`` (defaults
  10 / 3 / 60 s), ``--health-check-interval-secs 5 --health-failure-threshold 3`` (default 60 s),
  ``--retry-max-retries 2``: the same values as SGLang Model Gateway, so the two compare like for like.

LiteLLM proxy 1.108 (``litellm --config``; docs.litellm.ai ``docs/routing`` and
``docs/proxy/reliability``; ``litellm/router.py``):

* ``routing_strategy: latency-based-routing``: picks the deployment with the lowest recent latency
  (mean seconds per output token over its last <= 10 answers, ``lowest_latency.py``) among those
  within ``lowest_latency_buffer`` of the best,
* ``allowed_fails: 1`` and ``cooldown_time: 10``: a deployment that fails more than once in a
  minute is cooled down (taken out) for 10 s (docs ``proxy/reliability``, "Cooldowns"),
* ``num_retries: 2``: a failed call is retried (on another deployment when one is left).

Without the defence: ``round_robin`` for smg and vllm-router (deterministic shares, what the tests
count), LiteLLM's default ``simple-shuffle`` with no retries.

outlier-admin on top: smg and vllm-router are driven by the agent
(``python -m agent --gateway smg|vllm-router``, :meth:`RouterProcess.agent_args`);
LiteLLM by the callback :mod:`agent.litellm_callback`, loaded by the proxy itself
(``start_router("litellm", ..., outlier_group=..., redis_url=...)``). LiteLLM lives in its own venv
(``.venv-litellm``, made by ``scripts/ensure-litellm-venv.sh``: :func:`litellm_venv`).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.gateways import FAKE_MODEL, _Process, free_port, make_workdir

ROOT = Path(__file__).resolve().parents[1]
#: The LiteLLM venv (its own: LiteLLM pins many packages) and the script that makes it.
LITELLM_VENV = ROOT / ".venv-litellm"
LITELLM_SCRIPT = ROOT / "scripts" / "ensure-litellm-venv.sh"

ROUTERS = ("smg", "vllm-router", "litellm")
#: The test suite's own settings, which a router must not take for its own (LiteLLM would set up a
#: database at DATABASE_URL).
DROPPED_ENV = ("DATABASE_URL", "DIRECT_URL", "DJANGO_SETTINGS_MODULE")

#: The documented slow-backend defence of each router (module docstring), as CLI flags.
SMG_DEFENCE = ("--policy", "power_of_two", "--cb-failure-threshold", "3", "--cb-success-threshold", "2",
               "--cb-timeout-duration-secs", "10", "--health-check-interval-secs", "5",
               "--health-failure-threshold", "3", "--health-success-threshold", "2", "--retry-max-retries", "2")
VLLM_ROUTER_DEFENCE = SMG_DEFENCE
#: ``router_settings`` of the LiteLLM proxy's YAML (module docstring).
LITELLM_DEFENCE: dict[str, Any] = {"routing_strategy": "latency-based-routing", "allowed_fails": 1,
                                   "cooldown_time": 10, "num_retries": 2}
LITELLM_PLAIN: dict[str, Any] = {"routing_strategy": "simple-shuffle", "num_retries": 0}


def _bin(name: str) -> str:
    """An executable of the current venv (where ``pip install smg vllm-router`` put it), else PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def litellm_venv(create: bool = True) -> Path | None:
    """The LiteLLM venv's ``bin`` directory, made (or brought up to date with the agent's sources) by
    :data:`LITELLM_SCRIPT` when ``create``; None when it does not exist and could not be made."""
    if create and LITELLM_SCRIPT.exists():
        subprocess.run(["bash", str(LITELLM_SCRIPT)], cwd=ROOT, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=900)
    stamp = LITELLM_VENV / ".installed"
    binary = LITELLM_VENV / "bin" / "litellm"
    return binary.parent if stamp.exists() and binary.exists() else None


#: The LiteLLM proxy's master key in the harness's configuration (a test value, loopback only).
LITELLM_MASTER_KEY = "sk-outlier-test"


def _http(method: str, url: str, body: Any = None, timeout_s: float = 5.0,
          token: str | None = None) -> tuple[int, Any]:
    """One JSON call (status, decoded body or text), with ``token`` as the bearer credential."""
    hostport = url.removeprefix("http://").split("/", 1)[0]
    path = "/" + url.removeprefix("http://").split("/", 1)[1] if "/" in url.removeprefix("http://") else "/"
    host, _, port = hostport.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw.decode("utf-8", "replace")


class RouterProcess(_Process):
    """A router we started: ``url`` (its OpenAI entry point), ``kind``, ``backends``, ``log_path``."""

    def __init__(self, kind: str, argv: list[str], workdir: Path, backends: dict[str, str], *,
                 env: dict[str, str] | None = None, ready_timeout_s: float = 60.0, port: int,
                 token: str | None = None) -> None:
        self.kind = kind
        #: The bearer credential of its API (the router's --api-key, LiteLLM's master key), if any.
        self.token = token
        #: The router's own Prometheus metrics (smg, vllm-router: a loopback port of their own).
        self.metrics_url: str | None = None
        self.workdir = Path(workdir)
        self.backends = dict(backends)
        self.port = port
        self.argv = argv
        self.log_path = self.workdir / f"{kind}.log"
        self._log = self.log_path.open("wb")
        run_env = {**os.environ, **(env or {})}
        for name in DROPPED_ENV:
            run_env.pop(name, None)
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir, env=run_env)
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the router routes to every backend (smg, vllm-router: its worker list; LiteLLM: a
        completion answered)."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.log_tail()}")
            try:
                last = self.routable()
                if last is not None and len(last) >= len(self.backends):
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"{self.kind} not ready after {timeout_s}s (last: {last!r}): {self.log_tail()}")

    def call(self, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
        """One JSON call to the router, with its credential."""
        return _http(method, f"{self.url}{path}", body, timeout_s, self.token)

    def chat(self, content: str = "hello", max_tokens: int = 4) -> tuple[int, Any]:
        """One chat completion through the router."""
        return self.call("POST", "/v1/chat/completions",
                         {"model": FAKE_MODEL, "messages": [{"role": "user", "content": content}],
                          "max_tokens": max_tokens})

    def routable(self) -> set[str] | None:
        """The backends (``host:port``) the router routes to now, or None where it cannot say."""
        if self.kind == "smg":
            status, body = self.call("GET", "/workers")
            if status != 200:
                return None
            return {w["url"].removeprefix("http://") for w in body.get("workers", []) if w.get("status") == "ready"}
        if self.kind == "vllm-router":
            status, body = self.call("GET", "/workers")
            if status != 200:
                return None
            return {w["url"].removeprefix("http://") for w in body.get("workers", []) if w.get("is_healthy")}
        # /health/readiness answers once the proxy has loaded its config (callbacks included): a
        # completion sent earlier could be routed before the callbacks are in place.
        status, _ = self.call("GET", "/health/readiness")
        if status != 200:
            return None
        status, _ = self.chat("ready?", 1)
        return set(self.backends.values()) if status == 200 else None

    def agent_args(self) -> list[str]:
        """The agent's gateway options for this router (smg, vllm-router); LiteLLM needs no agent."""
        workers = [f"http://{a}" for a in self.backends.values()]
        if self.kind == "smg":
            return ["--gateway", "smg", "--router-url", self.url, "--router-workers", *workers]
        if self.kind == "vllm-router":
            return ["--gateway", "vllm-router", "--router-url", self.url, "--router-workers", *workers]
        raise ValueError("LiteLLM is driven by its callback (agent.litellm_callback), not the agent")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        # The routers drain for seconds on SIGTERM (smg: a 5 s settle window): a test router has
        # nothing to drain, so it gets one second, then SIGKILL (by its pid).
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if not self._log.closed:
            self._log.close()


def _metrics_args(metrics_port: int | None) -> list[str]:
    """Both routers serve Prometheus metrics on 0.0.0.0:29000 by default: two routers on one host
    collide there (the second exits), and tests bind loopback only. A free loopback port instead."""
    return ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port or free_port())]


def smg_argv(port: int, backends: dict[str, str], *, defence: bool = True, extra: tuple[str, ...] = (),
             metrics_port: int | None = None) -> list[str]:
    """``smg launch`` in front of ``backends`` (module docstring for the defence)."""
    policy = SMG_DEFENCE if defence else ("--policy", "round_robin")
    return [_bin("smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *[f"http://{a}" for a in backends.values()], *policy,
            *_metrics_args(metrics_port), "--log-level", "warn", *extra]


def vllm_router_argv(port: int, backends: dict[str, str], *, defence: bool = True,
                     extra: tuple[str, ...] = (), metrics_port: int | None = None) -> list[str]:
    """``vllm-router`` in front of ``backends`` (module docstring for the defence)."""
    policy = VLLM_ROUTER_DEFENCE if defence else ("--policy", "round_robin")
    return [_bin("vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *[f"http://{a}" for a in backends.values()], *policy,
            *_metrics_args(metrics_port), "--log-level", "warning", *extra]


def litellm_config(backends: dict[str, str], *, defence: bool = True, model: str = FAKE_MODEL,
                   outlier: bool = False, router_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proxy's YAML as a dict: one deployment per backend (``api_base`` = the node's address, how
    the callback maps nodes to deployments), the router settings, and with ``outlier`` the callback."""
    config: dict[str, Any] = {
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"openai/{model}", "api_base": f"http://{addr}/v1",
                                           "api_key": "none", "timeout": 300},
                        "model_info": {"id": name}}
                       for name, addr in backends.items()],
        "router_settings": {**(LITELLM_DEFENCE if defence else LITELLM_PLAIN), **(router_settings or {})},
        "general_settings": {"master_key": LITELLM_MASTER_KEY},
    }
    if outlier:
        config["litellm_settings"] = {"callbacks": ["agent.litellm_callback.outlier_filter"]}
    return config


def start_router(kind: str, backends: dict[str, str], workdir: Path | None = None, *, defence: bool = True,
                 extra: tuple[str, ...] = (), model: str = FAKE_MODEL, outlier_group: str | None = None,
                 redis_url: str | None = None, env: dict[str, str] | None = None,
                 api_key: str | None = None, ready_timeout_s: float = 90.0) -> RouterProcess:
    """Start ``kind`` (:data:`ROUTERS`) in front of ``backends``; returns once it routes to all of them.

    LiteLLM: ``outlier_group`` (with ``redis_url``) loads the outlier-admin callback for that group
    (``OUTLIER_LITELLM_GROUPS`` maps the model name to it); ``env`` is passed on (e.g. the callback's
    ``OUTLIER_LITELLM_*`` settings). smg, vllm-router: ``api_key`` is passed as their ``--api-key``.
    Raises RuntimeError when the LiteLLM venv cannot be made.
    """
    workdir = Path(workdir) if workdir is not None else make_workdir(f"oa-{kind}-")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if api_key and kind != "litellm":
        extra = (*extra, "--api-key", api_key)
    if kind in ("smg", "vllm-router"):
        argv_of = smg_argv if kind == "smg" else vllm_router_argv
        metrics_port = free_port()
        router = RouterProcess(kind, argv_of(port, backends, defence=defence, extra=extra, metrics_port=metrics_port),
                               workdir, backends, env=env, ready_timeout_s=ready_timeout_s, port=port, token=api_key)
        router.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        return router
    if kind != "litellm":
        raise ValueError(f"unknown router {kind!r} (one of {', '.join(ROUTERS)})")
    bindir = litellm_venv()
    if bindir is None:
        raise RuntimeError(f"no LiteLLM venv at {LITELLM_VENV} (bash {LITELLM_SCRIPT} failed)")
    import yaml

    config = litellm_config(backends, defence=defence, model=model, outlier=outlier_group is not None)
    config_path = workdir / "litellm.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_env = {"LITELLM_LOG": "ERROR", "LITELLM_MODE": "PRODUCTION", "NO_DOCS": "True",
               "DISABLE_SCHEMA_UPDATE": "True", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               # The venv's own site-packages only: the test's PYTHONPATH (the worktree) must not leak in.
               "PYTHONPATH": ""}
    if outlier_group is not None:
        run_env["OUTLIER_LITELLM_GROUPS"] = f"{model}={outlier_group}"
        run_env["OUTLIER_LITELLM_LOG_LEVEL"] = "DEBUG"
        if redis_url:
            run_env["OUTLIER_LITELLM_REDIS_URL"] = redis_url
    argv = [str(bindir / "litellm"), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1", *extra]
    return RouterProcess(kind, argv, workdir, backends, env={**run_env, **(env or {})},
                         ready_timeout_s=ready_timeout_s, port=port, token=LITELLM_MASTER_KEY)
