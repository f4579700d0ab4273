"""Run the demo: embedded defaults, seed, simulated gateways through the real ingest path, ticks,
canaries, alerts, the web app on 127.0.0.1:PORT. ``DEMO_SECONDS=N`` stops it after N seconds.

Threads (all stopped at exit): the web server (Django WSGI, threaded), one canary HTTP server per
simulated node (its engine's ``/metrics`` and ``/v1/completions``), the canary loop (Celery task ``control.run_due_canaries``, run in process),
the event scan (alerts and JSON events), and the main loop below, once per ``DEMO_TICK_S``:

1. the fleet (the simulator's step engines, :mod:`outlier_admin.demo.fleet`) advances to now:
   arrivals are routed by each group's gateway using the published weights; completed requests
   become access-log records;
2. the records go through :func:`outlier_admin.ingest.pipeline.submit` (validation, node
   resolution, Redis stream) — the function behind ``POST /api/v1/ingest/requests``;
3. each group ticks (:func:`outlier_admin.control.tick.run_tick`: stream -> detector -> weights
   published to Redis -> history in SQL);
4. the gateways re-read their group's weights document; new transitions are printed;
5. with ``DEMO_HEAL_AFTER_PROBES``, the faults heal once the throttled node has failed that many
   canary probes (:func:`heal_after_probes`).

What the demo may touch on a shared machine. Before anything else it binds its port (``PORT``): a
busy port is refused with one line and exit status 2, before the SQLite file or Redis is touched, so
a second ``make demo`` next to a running one changes nothing. Then it takes, on the Redis it uses,
the lease :data:`LEASE_KEY` (renewed while it runs, gone :data:`LEASE_TTL_MS` after a crash): one demo
per Redis database, since two would feed the same groups' streams. Holding it, the demo deletes the
keys of **its own two groups** only (every key with ``demo-llama3-70b-h100`` or ``demo-qwen2-72b-a100``
as one ``:``-separated part: the streams, detector state and weights of an earlier demo run, which
refer to an old database) and never another key: another stack's groups (a colleague's control
plane on the same Redis) keep theirs, and the keys every group shares (``outlier:obs:*`` event-scan
cursors, ``outlier:alerts:*``) are never deleted. The demo's event scan reads and moves those shared
keys like any other scanner of that database, so next to another stack give the demo a database of
its own (``REDIS_URL=redis://HOST:6379/N``); it says so when it finds other groups' weights there.
The fresh ``demo.sqlite3`` is deleted only under its lock (:func:`lock_demo_db`): a second demo on
another port would otherwise delete the first one's database under it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import socketserver
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from contract import keys

BASE_DIR = Path(__file__).resolve().parents[2]
DEMO_DB = BASE_DIR / "demo.sqlite3"
ACTOR = "system:demo"
#: One demo per Redis database (see the module docstring); the value names the holder's pid and port.
LEASE_KEY = keys.DEMO_LEASE
#: How long a crashed demo's lease outlives it; a live demo renews it every third of that.
LEASE_TTL_MS = 15_000


def say(msg: str) -> None:
    print(msg, flush=True)


def prepare_environment(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Embedded defaults, set before Django reads its settings. Returns what was chosen. Deletes
    nothing: the old ``demo.sqlite3`` goes only once this demo holds its port and the file's lock
    (:func:`lock_demo_db`, :func:`remove_demo_db`)."""
    env = os.environ if env is None else env
    env.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    env["CELERY_TASK_ALWAYS_EAGER"] = "1"  # Celery tasks run in this process
    env.setdefault("LOG_JSON", "0")  # a console for people; deployments keep JSON
    env.setdefault("LOG_LEVEL", "ERROR")  # transitions and alerts are printed below
    chosen: dict[str, Any] = {"fresh_db": False}
    (BASE_DIR / "staticfiles").mkdir(exist_ok=True)  # STATIC_ROOT: whitenoise warns when it is missing
    if not env.get("DATABASE_URL"):
        env["DATABASE_URL"] = f"sqlite:///{DEMO_DB}"
        chosen["fresh_db"] = True
    return chosen


def db_lock_path(path: Path = DEMO_DB) -> Path:
    """The lock file of the SQLite database ``path``: in the temporary directory (nothing to ignore
    in the checkout), named after the database's absolute path (one lock per checkout)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"outlier-admin-demo-{digest}.lock"


def lock_demo_db(path: Path = DEMO_DB) -> IO[str] | None:
    """An exclusive lock on :func:`db_lock_path`, held until the returned file is closed (at exit at
    the latest), or ``None`` when another demo holds it: that demo's database must not be deleted."""
    fh = open(db_lock_path(path), "a")  # noqa: SIM115 - held open for the demo's lifetime
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def remove_demo_db(path: Path = DEMO_DB) -> None:
    """Delete the previous run's SQLite file (and its WAL): call only under :func:`lock_demo_db`."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def choose_redis(url: str) -> tuple[Any, str]:
    """``(client, description)``: Redis at ``url`` when it answers PING within 0.5 s, else an
    in-process fakeredis (the demo then needs no service at all)."""
    import redis

    from contract.topology import redis_from_url

    try:
        client = redis_from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
        client.ping()
        return client, f"Redis at {url}"
    except (redis.RedisError, OSError, ValueError):
        import fakeredis

        return fakeredis.FakeRedis(), f"in-process Redis stand-in (fakeredis; {url} not reachable)"


def _sqlite_tuning() -> None:
    # Several threads write (ticks, canaries, the web app): wait for the lock instead of failing,
    # take it up front (no deadlocking lock upgrades) and let readers run beside the writer (WAL).
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db["CONN_MAX_AGE"] = 0
        db.setdefault("OPTIONS", {}).update({
            "timeout": 30, "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        })


def demo_lease(client: Any, port: int) -> Any:
    """Take :data:`LEASE_KEY` (renewed in the background while the demo runs); ``None`` when
    another demo holds it. Returns the :class:`~outlier_admin.control.redis_conn.GroupLock`."""
    from outlier_admin.control.redis_conn import GroupLock

    lease = GroupLock(client, LEASE_KEY, LEASE_TTL_MS, max_hold_ms=10 * 365 * 86_400_000)
    lease.token = f"pid {os.getpid()} port {port} {lease.token}"
    return lease if lease.acquire() else None


def lease_holder(client: Any) -> str:
    """Who holds :data:`LEASE_KEY` (``pid N port P``), for the refusal message."""
    raw = client.get(LEASE_KEY)
    return " ".join(raw.decode().split()[:4]) if raw else "unknown"


def own_key(key: bytes | str, groups: tuple[str, ...]) -> bool:
    """Whether ``key`` belongs to one of ``groups``: one of its ``:``-separated parts is exactly a
    group's name, or its hash tag ``{<group>}`` (names cannot contain ``:``, ``{`` or ``}``), so
    ``outlier:{demo-x-2}:stream`` is not ``demo-x``'s."""
    text = key.decode() if isinstance(key, bytes) else key
    return any(part.removeprefix("{").removesuffix("}") in groups for part in text.split(":"))


def clear_demo_keys(r: Any) -> int:
    """Delete the keys of the demo's own groups (an earlier run's streams, state and weights, which
    refer to another database) and nothing else; returns how many. Call only under the lease."""
    from outlier_admin.demo.fleet import LARGE, SMALL

    groups = (LARGE, SMALL)
    found = {k for g in groups for k in r.scan_iter(match=f"{keys.PREFIX}*{g}*", count=1000) if own_key(k, groups)}
    if found:
        r.delete(*found)
    return len(found)


def other_groups(r: Any) -> list[str]:
    """Groups other than the demo's with a weights document in this Redis database: another stack
    shares it (the demo leaves its keys alone, but shares the event-scan cursors with it)."""
    from outlier_admin.demo.fleet import LARGE, SMALL

    names = {keys.group_of(k) for k in r.scan_iter(match=keys.weights("*"), count=1000)}
    return sorted(n for n in names - {LARGE, SMALL} if n)


def seed(cfg: Any, addresses: dict[tuple[int, int], str], password: str) -> list[Any]:
    """Two groups (32 + 8 nodes) and the demo operator; idempotent (re-running reuses them). With
    ``DEMO_CANARY_INTERVAL_S`` set, both groups' canary interval is set to it."""
    from django.contrib.auth.models import User

    from outlier_admin.control.actions import (
        do_create_group,
        do_register_node,
        do_set_roles,
        do_unretire_node,
        do_update_node,
        do_update_thresholds,
    )
    from outlier_admin.demo.fleet import LARGE, SMALL, node_name
    from outlier_admin.fleet.models import ModelGroup, Node

    groups = []
    specs = [(LARGE, "auto", 32, "Llama-3-70B", "8xH100"), (SMALL, cfg.small_policy, 8, "Qwen2-72B", "8xA100")]
    for gi, (name, policy, n, model, hw) in enumerate(specs):
        group = ModelGroup.objects.filter(name=name).first() or do_create_group(
            name, actor=ACTOR, reason="demo fleet", policy=policy, model_name=model, hardware_class=hw,
            created_via="demo")
        for i in range(n):
            nm, address = node_name(gi, i), addresses[(gi, i)]
            metrics_url = f"http://{address}/metrics"
            node = Node.objects.filter(group=group, name=nm).first()
            if node is None:
                do_register_node(group, address, actor=ACTOR, name=nm, reason="demo fleet", metrics_url=metrics_url)
                continue
            # A re-run: the node comes back (audited) on this run's simulated address.
            if node.retired:
                do_unretire_node(node, actor=ACTOR, reason="demo fleet (re-run)")
            changes = {k: v for k, v in (("address", address), ("metrics_url", metrics_url)) if getattr(node, k) != v}
            if changes:
                do_update_node(node, changes, actor=ACTOR, reason="demo fleet (re-run)")
        if cfg.canary_interval_s is not None and group.thresholds().canary_interval_s != cfg.canary_interval_s:
            # Through the operator's path (versioned, audited), as a threshold change in the dashboard.
            do_update_thresholds(group, {"canary_interval_s": cfg.canary_interval_s}, actor=ACTOR,
                                 reason="demo: DEMO_CANARY_INTERVAL_S")
            group.refresh_from_db()
        groups.append(group)
    user, _ = User.objects.get_or_create(username="demo", defaults={"is_staff": True})
    user.is_staff = True
    user.set_password(password)
    user.save()
    do_set_roles(user, ["viewer", "operator", "oncall"], actor=ACTOR, reason="demo operator")
    return groups


def _faults(cfg: Any) -> list[tuple[int, int, str, float, str]]:
    """The demo's injected faults: ``(group index, node index, kind, start in demo seconds, what)``."""
    from outlier_admin.demo.fleet import PCIE_NODE, THERMAL_NODE

    return [(0, THERMAL_NODE, "thermal_throttle", cfg.fault_at_s, "3x slower per step"),
            (1, PCIE_NODE, "pcie_downgrade", cfg.pcie_at_s, "decode 2.5x, prefill 1.5x slower")]


def mark_injected_faults(cfg: Any, started: float, groups: list[Any]) -> None:
    """One audit event ``demo.fault`` per fault the demo will inject (node, kind, start and end in epoch
    seconds): the first screen shows them as a banner and marks the node's incident, so a newcomer
    tells an injected fault from the detector's own calls (a false cut among them)."""
    from django.db import transaction

    from outlier_admin.control.actions import audit
    from outlier_admin.demo.fleet import node_name
    from outlier_admin.fleet.models import Node

    with transaction.atomic():
        for gi, i, kind, at_s, what in _faults(cfg):
            node = Node.objects.get(group=groups[gi], name=node_name(gi, i))
            audit("demo.fault", ACTOR, node=node, reason=f"injected by the demo, not a real fault: {what}",
                  detail={"kind": kind, "node": node.name, "starts_at": round(started + at_s, 3),
                          "ends_at": round(started + cfg.heal_at_s, 3)})


def heal_after_probes(cfg: Any, fleet: Any, groups: list[Any]) -> float | None:
    """``DEMO_HEAL_AFTER_PROBES``: once the throttled node has failed that many canary probes, end both
    faults now (:meth:`SimulatedFleet.heal`) and record one audit event ``demo.heal`` per fault (node,
    kind, when, epoch seconds: the first screen's banner ends the fault there). Returns the demo time
    of the heal, or ``None`` while the probes are fewer."""
    from datetime import UTC, datetime

    from django.db import transaction

    from outlier_admin.control.actions import audit
    from outlier_admin.control.models import CanaryProbe
    from outlier_admin.demo.fleet import THERMAL_NODE, node_name
    from outlier_admin.fleet.models import Node

    failed = CanaryProbe.objects.filter(  # this run's (a kept database holds an earlier run's too)
        node__group=groups[0], node__name=node_name(0, THERMAL_NODE), passed=False,
        at__gte=datetime.fromtimestamp(fleet.started, UTC)).count()
    if failed < cfg.heal_after_probes:
        return None
    t_rel = fleet.heal()
    with transaction.atomic():
        for gi, i, kind, _, _ in _faults(cfg):
            node = Node.objects.get(group=groups[gi], name=node_name(gi, i))
            audit("demo.heal", ACTOR, node=node, reason=f"healed by the demo after {failed} failed probes of "
                  f"{node_name(0, THERMAL_NODE)} (DEMO_HEAL_AFTER_PROBES)",
                  detail={"kind": kind, "node": node.name, "healed_at": round(fleet.started + t_rel, 3)})
    say(f"  +{t_rel:6.1f}s both faults healed: {node_name(0, THERMAL_NODE)} failed {failed} probes "
        "(DEMO_HEAL_AFTER_PROBES)")
    return t_rel


def demo_api_token() -> str:
    """A new API token acting as the demo user (all three roles), shown once per run; audited."""
    from django.contrib.auth.models import User

    from outlier_admin.control.actions import do_create_token

    _, plaintext = do_create_token(name=f"demo-{time.strftime('%Y%m%d-%H%M%S')}", scope="api", actor=ACTOR,
                                   user=User.objects.get(username="demo"))
    return plaintext


class _ThreadedWSGIServer(socketserver.ThreadingMixIn):
    daemon_threads = True


def bind_web(port: int, bind: str = "127.0.0.1") -> Any:
    """The web server, bound to ``bind:port`` but not serving yet (:func:`serve_web`): the demo's
    first act, so a busy port stops it before it changes any file or key. Raises ``OSError``."""
    from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer

    server_cls = type("DemoWSGIServer", (_ThreadedWSGIServer, WSGIServer), {})
    return server_cls((bind, port), WSGIRequestHandler, ipv6=False)


def serve_web(httpd: Any) -> Any:
    """Serve the Django app on the bound ``httpd`` in a thread (needs ``django.setup()``)."""
    from django.core.handlers.wsgi import WSGIHandler

    httpd.set_app(WSGIHandler())
    threading.Thread(target=httpd.serve_forever, name="web", daemon=True).start()
    return httpd


def _loop(stop: threading.Event, every_s: float, fn: Any, name: str) -> threading.Thread:
    from django.db import close_old_connections

    def run() -> None:
        while not stop.is_set():
            try:
                fn()
            except Exception as exc:  # a demo thread reports and keeps going
                say(f"[{name}] {type(exc).__name__}: {exc}")
            finally:
                close_old_connections()
            stop.wait(every_s)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def main() -> int:
    from outlier_admin.demo.config import DemoConfig, DemoConfigError

    try:
        cfg = DemoConfig.from_env()
    except DemoConfigError as exc:
        say(f"demo: {exc}")
        return 2
    chosen = prepare_environment()
    try:
        httpd = bind_web(cfg.port, cfg.bind)
    except OSError as exc:
        say(f"demo: cannot listen on {cfg.bind}:{cfg.port} ({exc.strerror}): another demo or service has it; "
            "set PORT to a free port (nothing was changed)")
        return 2
    lease = None
    db_lock = None
    try:
        if chosen["fresh_db"]:
            db_lock = lock_demo_db()
            if db_lock is None:
                say(f"demo: another demo is using {DEMO_DB} (it holds {db_lock_path()}); stop it or set "
                    "DATABASE_URL (nothing was changed)")
                return 2
            remove_demo_db()
        from django.conf import settings

        _sqlite_tuning()
        import django

        django.setup()
        from django.core.management import call_command

        from outlier_admin.control import redis_conn

        client, redis_desc = choose_redis(settings.REDIS_URL)
        lease = demo_lease(client, cfg.port)
        if lease is None:
            say(f"demo: another demo runs on {settings.REDIS_URL} ({lease_holder(client)}, key {LEASE_KEY}); "
                "stop it or set REDIS_URL to another database (nothing was changed in Redis)")
            return 2
        redis_conn.set_redis(client)
        clear_demo_keys(client)
        others = other_groups(client)
        db = settings.DATABASES["default"]
        db_desc = (f"SQLite {db['NAME']}" + (" (fresh)" if chosen["fresh_db"] else "")
                   if db["ENGINE"].endswith("sqlite3") else f"PostgreSQL {db.get('HOST')}/{db['NAME']}")
        say("outlier-admin demo")
        say(f"  database : {db_desc}")
        say(f"  redis    : {redis_desc}")
        if others:
            say(f"             also holds {len(others)} other group(s) ({', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}): their keys are left alone, but the event-scan cursors "
                f"({keys.OBS_PREFIX}*) are shared with them; REDIS_URL=redis://HOST:PORT/N gives the demo its own database")
        say("  celery   : tasks run in this process (CELERY_TASK_ALWAYS_EAGER)")
        call_command("migrate", verbosity=0, interactive=False)
        return run(cfg, client, httpd)
    finally:
        httpd.server_close()
        if lease is not None:
            lease.release()
        if db_lock is not None:
            db_lock.close()


def run(cfg: Any, client: Any, httpd: Any) -> int:
    """The demo itself, serving on ``httpd`` (bound by :func:`bind_web`) until ``DEMO_SECONDS`` or Ctrl-C:
    the simulated fleet and its canaries started, the groups seeded, then one :func:`_demo_round` every
    ``tick_s``, with the canary and the event scan on threads of their own."""
    from django.db import close_old_connections

    from agent.client import GatewayClient
    from outlier_admin.control.models import Transition
    from outlier_admin.control.tasks import run_due_canaries
    from outlier_admin.demo.fleet import CanaryServer, SimulatedFleet
    from outlier_admin.ingest.pipeline import directory
    from outlier_admin.observability.events import scan_events

    gateways: list[GatewayClient] = []

    def weights_of(gi: int) -> dict[str, int] | None:
        eff = gateways[gi].effective() if gi < len(gateways) else None
        return None if eff is None else {n.node: (0 if n.quarantined else n.weight) for n in eff.nodes}

    fleet = SimulatedFleet(cfg, weights_of)
    canaries = {(gi, i): CanaryServer(fleet, gi, i).start()
                for gi, g in enumerate(fleet.scn.groups) for i in range(g.nodes)}
    password = cfg.password or secrets.token_urlsafe(9)
    groups = seed(cfg, {k: c.address for k, c in canaries.items()}, password)
    mark_injected_faults(cfg, fleet.started, groups)
    directory.clear()
    gateways.extend(GatewayClient(client, g.name) for g in groups)
    serve_web(httpd)
    _print_banner(cfg, password)

    stop = threading.Event()
    threads = [
        _loop(stop, 1.0, lambda: run_due_canaries.delay(), "canary"),
        _loop(stop, 2.0, _print_alerts(scan_events), "events"),
    ]
    last_seen = Transition.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    counts = {"records": 0, "scrapes": 0, "ticks": 0}
    deadline = fleet.started + cfg.seconds if cfg.seconds else float("inf")
    healed = cfg.heal_after_probes is None
    try:
        while not stop.is_set() and time.time() < deadline:
            loop_started = time.time()
            _demo_round(fleet, groups, gateways, counts)
            last_seen = _print_transitions(last_seen, fleet.rel())
            if not healed and fleet.rel() < cfg.heal_at_s:
                healed = heal_after_probes(cfg, fleet, groups) is not None
            close_old_connections()
            time.sleep(max(0.0, cfg.tick_s - (time.time() - loop_started)))
    except KeyboardInterrupt:
        say("demo: interrupted")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=3)
        httpd.shutdown()
        for c in canaries.values():
            c.stop()
    say(_summary(counts))
    return 0


def _print_banner(cfg: Any, password: str) -> None:
    """What the demo tells its user once it serves: the dashboard and its login, an API token (made
    now), the ``manage.py`` line for its database, the metrics and health URLs, which faults it
    injects and when, each group's policy, and when it stops."""
    from outlier_admin.demo.fleet import LARGE, PCIE_NODE, SMALL, THERMAL_NODE, node_name

    base = f"http://127.0.0.1:{cfg.port}"
    api_token = demo_api_token()
    say(f"  dashboard: {base}/   login: demo / {password}   (admin: {base}/admin/)")
    say(f"  api token: {api_token}   (roles of demo; e.g. curl -H 'Authorization: Bearer {api_token}' "
        f"{base}/api/v1/nodes/?state=quarantined)")
    say(f"  manage.py: DATABASE_URL={os.environ['DATABASE_URL']} DJANGO_DEBUG=1 python manage.py ... "
        "(the demo's database, e.g. create_token, create_user)")
    say(f"  metrics  : {base}/metrics   health: {base}/healthz   ready: {base}/readyz")
    say(f"  faults   : thermal throttle on {LARGE}/{node_name(0, THERMAL_NODE)} at +{cfg.fault_at_s:g}s, "
        f"PCIe downgrade on {SMALL}/{node_name(1, PCIE_NODE)} at +{cfg.pcie_at_s:g}s, both heal at +{cfg.heal_at_s:g}s"
        + (f" or once {node_name(0, THERMAL_NODE)} failed {cfg.heal_after_probes} canary probes"
           if cfg.heal_after_probes is not None else ""))
    say(f"  policy   : {LARGE} auto; {SMALL} {cfg.small_policy}"
        + (" (approve its quarantine proposal in the dashboard)" if cfg.small_policy == "approval" else ""))
    say("  " + (f"stops after {cfg.seconds:g} s (DEMO_SECONDS)" if cfg.seconds else "Ctrl-C to stop"))


def _demo_round(fleet: Any, groups: list[Any], gateways: list[Any], counts: dict[str, int]) -> None:
    """One round, through the production paths: each simulated gateway's records pushed to ingest,
    every model server's ``/metrics`` scraped (its engine's counters), one tick per group, and each
    gateway reading its weights document and reporting it applied (a simulated gateway applies at
    once, and reports as an agent does). ``counts`` adds the records accepted, scrapes and ticks."""
    from outlier_admin.control.tick import run_tick
    from outlier_admin.ingest.pipeline import submit
    from outlier_admin.ingest.scraper import scrape_round as scrape_model_servers
    from outlier_admin.observability.hooks import observe_ingest, observe_tick

    for group, records in fleet.advance().items():
        outcome = submit([(i + 1, rec, None) for i, rec in enumerate(records)], source=f"demo-gateway:{group}")
        observe_ingest(outcome, source=f"demo-gateway:{group}")
        counts["records"] += outcome.accepted
    counts["scrapes"] += scrape_model_servers()
    for group in groups:
        observe_tick(run_tick(group.name, consumer="demo"))
        counts["ticks"] += 1
    for gw in gateways:
        gw.refresh()
        eff = gw.effective()
        if eff is not None:
            gw.report_applied("demo-gateway", eff.version, time.time(), eff.mode)


def _print_alerts(scan: Any) -> Any:
    def run() -> None:
        res = scan()
        for a in res.alerts:
            say(f"  ALERT {a.status:8s} {a.name}: {a.summary}")

    return run


def _print_transitions(last_seen: int, t_rel: float) -> int:
    from outlier_admin.control.models import Transition

    for t in Transition.objects.filter(pk__gt=last_seen).select_related("group", "node").order_by("pk"):
        last_seen = t.pk
        if t.reason == "warmed_up":
            continue
        z = f" Z={t.z:.1f}" if t.z is not None else ""
        say(f"  +{t_rel:6.1f}s {t.group.name}/{t.node.name}: {t.from_state} -> {t.to_state} ({t.reason}{z})")
    return last_seen


def _summary(counts: dict[str, int]) -> str:
    from django.db.models import Count

    from outlier_admin.control.models import Transition
    from outlier_admin.fleet.models import Node

    states = dict(Node.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    moved = Transition.objects.exclude(reason="warmed_up").count()
    return (f"demo finished: {counts['records']} records ingested, {counts['scrapes']} streamed-progress rows, "
            f"{counts['ticks']} ticks, "
            f"{moved} transitions; nodes by state: {states}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
