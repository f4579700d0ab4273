"""The control plane as the user ran it, on the PostgreSQL and Redis it is given.

What runs (each a process of its own, started here and stopped by pid):

- ``celery -A outlier_admin worker --beat`` (:class:`harness.gateways.CeleryWorker`): the
  ticks (``TICK_INTERVAL_MS``, the deployment's default unless ``tick_ms`` is given), the canaries,
  the publisher. Its own log tailing and DCGM scraping are pushed out to an hour: the log is tailed by
  ``tail_logs`` below (two tailers of one source would read the same lines twice: the tailer takes
  no lock on its checkpoint) and there is no DCGM here;
- ``manage.py scrape_metrics``: every node's ``metrics_url`` (llama.cpp's ``/metrics``), the
  streamed engine signal; while it runs, the beat's scrape rounds step aside (its Redis lease);
- ``manage.py tail_logs --add <source> --path <access.log> --format auto``: the gateway's access log
  into the ingest pipeline, as the user ran it;
- ``python -m agent`` with the gateway's arguments, only when the weights are applied
  (``--weights on``); with ``off`` the control plane still decides and publishes, nothing applies it.

The group and its nodes are created through the operator's actions (``do_create_group``,
``do_register_node`` with ``metrics_url``), in this process's Django. A drill's group is named
``drill-<hex>``; :func:`retire_stale` retires the ones earlier runs left behind (and disables their
log sources), since ticks, scrapes and tails run over every live group and source.

:class:`WeightsWatcher` polls the published document (:func:`contract.keys.weights`) and keeps every
change of a node's weight or state with the time it was seen: what a gateway was told, and when.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from contract import keys
from harness.gateways import CeleryWorker

ROOT = Path(__file__).resolve().parents[2]
GROUP_PREFIX = "drill-"
ACTOR = "drill"


def django_env() -> None:
    """Settings for a loopback run outside the test suite: a throwaway key, plain HTTP on 127.0.0.1."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    os.environ.setdefault("SECRET_KEY", "drill-" + secrets.token_hex(16))
    os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "0")


def new_group_name() -> str:
    return f"{GROUP_PREFIX}{uuid.uuid4().hex[:8]}"


def retire_stale() -> list[str]:
    """Retire live ``drill-*`` groups and disable ``drill-*`` log sources of earlier runs."""
    from outlier_admin.control.actions import do_retire_group
    from outlier_admin.fleet.models import ModelGroup
    from outlier_admin.ingest.models import IngestSource

    names = []
    for g in ModelGroup.objects.filter(name__startswith=GROUP_PREFIX, retired=False):
        do_retire_group(g, actor=ACTOR, reason="drill: a group an earlier drill left live")
        names.append(g.name)
    IngestSource.objects.filter(name__startswith=GROUP_PREFIX, enabled=True).update(enabled=False)
    return names


class _Child:
    """A ``manage.py`` / ``python -m`` subprocess with its log in the workdir, stopped by pid."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class WeightsWatcher:
    """Polls the group's weights document (:func:`contract.keys.weights`) every ``every_s`` and keeps each change (module docstring)."""

    def __init__(self, redis_client: Any, group: str, *, every_s: float = 0.2) -> None:
        self.r = redis_client
        self.key = keys.weights(group)
        self.every_s = every_s
        self.changes: list[dict[str, Any]] = []  # {"seen_at", "version", "nodes": {addr: [weight, state]}}
        self.documents = 0
        self._last: dict[str, list[Any]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="weights-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_version = None
        while not self._stop.wait(self.every_s):
            try:
                raw = self.r.get(self.key)
            except Exception:  # a Redis hiccup loses one sample, not the drill
                continue
            if not raw:
                continue
            try:
                doc = json.loads(raw)
                nodes = {n["address"]: [n.get("weight"), n.get("state")] for n in doc.get("nodes", [])}
                version = doc.get("version")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if version != last_version:
                self.documents += 1
                last_version = version
            if nodes != self._last:
                self._last = nodes
                self.changes.append({"seen_at": time.time(), "version": version, "nodes": nodes})

    def state_at(self, t: float) -> dict[str, list[Any]]:
        """The nodes' ``[weight, state]`` last seen at or before ``t`` (``{}`` before the first)."""
        out: dict[str, list[Any]] = {}
        for ch in self.changes:
            if ch["seen_at"] > t:
                break
            out = ch["nodes"]
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class ControlPlane:
    """The processes of the module docstring for one group; ``setup()``, ``start()``, ``stop()``."""

    def __init__(self, workdir: Path, group: str, engines: dict[str, tuple[str, str]], *, database_url: str,
                 redis_url: str, thresholds: dict[str, Any] | None = None, tick_ms: int | None = None,
                 policy: str = "auto") -> None:
        """``engines``: name -> (address, metrics_url)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.group_name = group
        self.engines = dict(engines)
        self.database_url = database_url
        self.redis_url = redis_url
        self.thresholds = dict(thresholds or {})
        self.tick_ms = tick_ms
        self.policy = policy
        self.source = group.replace("/", "_").replace(".", "_").replace("@", "_")  # a log source name
        self.group: Any = None
        self.worker: CeleryWorker | None = None
        self.children: dict[str, _Child] = {}

    # -- setup
    def setup(self) -> None:
        from outlier_admin.control.actions import do_create_group, do_register_node, do_update_thresholds

        retire_stale()
        self.group = do_create_group(self.group_name, actor=ACTOR, reason="real-engine drill", policy=self.policy,
                                     model_name="gemma-3-270m-q4_k_m", hardware_class="cpu-1thread")
        if self.thresholds:
            do_update_thresholds(self.group, dict(self.thresholds), actor=ACTOR, reason="drill: --threshold")
        for name, (address, metrics_url) in self.engines.items():
            do_register_node(self.group, address, actor=ACTOR, metrics_url=metrics_url,
                             labels={"drill_engine": name}, reason="drill: llama.cpp server")

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url}
        env.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
        for key in ("SECRET_KEY", "ALLOWED_HOSTS", "SECURE_SSL_REDIRECT"):
            if key in os.environ:
                env[key] = os.environ[key]
        if self.tick_ms:
            env["TICK_INTERVAL_MS"] = str(self.tick_ms)
        env.update(extra)
        return env

    def _child(self, name: str, argv: list[str], **env: str) -> _Child:
        child = _Child(name, argv, self.env(**env), self.workdir / f"{name}.log")
        self.children[name] = child
        return child

    # -- processes
    def start(self, gateway: Any, *, canaries: bool = True) -> None:
        """Worker+beat, the scraper and the log tailer for ``gateway``'s access log. ``canaries=False``:
        no canary probe is sent (``CANARY_INTERVAL_S`` a day): the router-alone arm of the drill,
        where nothing acts on the decisions and a probe would only add work to the throttled node."""
        extra = {} if canaries else {"CANARY_INTERVAL_S": "86400"}
        self.worker = CeleryWorker(self.workdir / "celery", self.env(LOG_TAIL_INTERVAL_S="3600",
                                                                     DCGM_SCRAPE_INTERVAL_S="3600", **extra), cwd=ROOT)
        manage = [sys.executable, str(ROOT / "manage.py")]
        self._child("scrape_metrics", [*manage, "scrape_metrics", "--refresh", "5", "--metrics-port", "0"])
        gateway.access_log.touch()
        tail = [*manage, "tail_logs", "--add", self.source, "--path", str(gateway.access_log), "--format", "auto",
                "--group", self.group_name, "--interval", "1"]
        if gateway.node_map:
            tail += ["--node-map", json.dumps(gateway.node_map)]
        self._child("tail_logs", tail)

    def start_agent(self, gateway: Any) -> _Child:
        """``python -m agent`` for ``gateway`` (``--weights on``)."""
        return self._child("agent", [sys.executable, "-m", "agent", *gateway.agent_args(self.group_name),
                                     "--redis-url", self.redis_url, "--poll-interval", "1",
                                     "--gateway-id", f"drill/{gateway.kind}"])

    def check_alive(self) -> list[str]:
        """The processes that died (name: last log lines): a drill with a dead part measures nothing."""
        dead = [f"{n}: {c.tail(600)}" for n, c in self.children.items() if not c.alive()]
        if self.worker is not None and (self.worker.proc is None or self.worker.proc.poll() is not None):
            dead.append(f"celery: {self.worker.log_path.read_text(errors='replace')[-600:]}")
        return dead

    # -- results
    def transitions(self) -> list[dict[str, Any]]:
        """Every state change of the group's nodes, oldest first, as PostgreSQL has them."""
        from outlier_admin.control.models import Transition

        rows = Transition.objects.filter(group__name=self.group_name).order_by("at", "id").values(
            "at", "node__name", "node__address", "from_state", "to_state", "reason", "signal", "z", "shadow")
        return [{"at": r["at"].timestamp(), "node": r["node__name"], "address": r["node__address"],
                 "from": r["from_state"], "to": r["to_state"], "reason": r["reason"], "signal": r["signal"],
                 "z": r["z"], "shadow": r["shadow"]} for r in rows]

    def probes(self) -> list[dict[str, Any]]:
        """Every canary probe the control plane sent the group's nodes (time, node, tokens, outcome):
        its own traffic, which the engines' counters count with the clients'."""
        from outlier_admin.control.models import CanaryProbe

        rows = CanaryProbe.objects.filter(node__group__name=self.group_name).order_by("at").values(
            "at", "node__address", "ok", "prompt_tokens", "completion_tokens", "total_ms")
        return [{"at": r["at"].timestamp(), "address": r["node__address"], "ok": r["ok"],
                 "prompt_tokens": r["prompt_tokens"], "completion_tokens": r["completion_tokens"],
                 "total_ms": r["total_ms"]} for r in rows]

    def ingest_counts(self) -> dict[str, Any]:
        """What ``tail_logs`` accepted and refused (by reason), summed from the lines it printed, and
        the scraper's closing line. From the printed lines, not ``IngestSource.accepted_total``: the
        command keeps its source rows from the first pass, so that total is overwritten with the
        last pass's count (seen in the drill; noted in /work/notes/drill.md)."""
        accepted = rejected = 0
        reasons: dict[str, int] = {}
        child = self.children.get("tail_logs")
        text = child.log_path.read_text(errors="replace") if child else ""
        for m in re.finditer(r"^\S+: accepted (\d+) \((\d+) latency-only\) rejected (\d+)", text, re.M):
            accepted += int(m.group(1))
            rejected += int(m.group(3))
        for m in re.finditer(r"^  rejected (\d+) (\S+)", text, re.M):
            reasons[m.group(2)] = reasons.get(m.group(2), 0) + int(m.group(1))
        scraper = self.children.get("scrape_metrics")
        stopped = re.findall(r"^stopped: .*$", scraper.log_path.read_text(errors="replace"), re.M) if scraper else []
        return {"log_accepted": accepted, "log_rejected": rejected, "log_rejected_by_reason": reasons,
                "scraper": stopped[-1] if stopped else None}

    def stop(self) -> None:
        from outlier_admin.control.actions import ActionError, do_retire_group
        from outlier_admin.ingest.models import IngestSource

        for child in reversed(list(self.children.values())):
            child.stop()
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        if self.group is not None:
            with contextlib.suppress(ActionError):
                do_retire_group(self.group, actor=ACTOR, reason="drill finished")
            IngestSource.objects.filter(name=self.source).update(enabled=False)


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database ``url`` names when it does not exist (the drill's own)."""
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(url)
    conninfo = {"host": db["HOST"] or "127.0.0.1", "port": db["PORT"] or 5432, "user": db["USER"],
                "password": db.get("PASSWORD") or None, "dbname": "postgres"}
    with psycopg.connect(**{k: v for k, v in conninfo.items() if v is not None}, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db["NAME"],)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def prepare_database() -> str | None:
    """The drill's own PostgreSQL database, created when missing and migrated, with Django set up for
    this process; or what to set when ``DATABASE_URL`` / ``REDIS_URL`` are missing."""
    django_env()
    if "DATABASE_URL" not in os.environ or "REDIS_URL" not in os.environ:
        return "set DATABASE_URL and REDIS_URL (the drill's own database and Redis db number)"
    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return None
