"""A fingerprint of the REST API's and the dashboard's responses on a fixed, seeded fixture, to show a
refactoring of the control plane changed no response.

``DATABASE_URL=postgres://.../oa_x REDIS_URL=redis://127.0.0.1:P/0 python scripts/api_fingerprint.py
--recreate`` builds the fixture, requests every GET page of the API and the dashboard and prints one
SHA-256 per response (over its status, its content type and its body) and a total; the same total
before and after a change means every response is byte for byte as it was. ``--keep DIR`` writes the
bodies there (one file per response, named as in the listing); ``--list`` prints the requests only.

The fixture, with the clock frozen (``time_machine``) at :data:`T0` and moved by hand: two groups
(``llama``: 8 nodes, policy ``auto``; ``qwen``: 6 nodes, policy ``approval``) built by the control
plane's actions (:mod:`outlier_admin.control.actions`), fed :data:`TICKS` rounds of seeded access-log
records (``harness.records.make_records``, one slow node per group) through the ingest pipeline
(:func:`outlier_admin.ingest.pipeline.submit`) and ticked (:func:`outlier_admin.control.tick.run_tick`)
every :data:`TICK_EVERY_S` seconds: transitions, incidents, history, baselines, proposals. After each
tick the canary task (:func:`outlier_admin.control.canary.run_due_probes`) probes the nodes the tick
marked due, through an in-process stand-in of the nodes (an ``httpx.MockTransport`` answering with
llama.cpp's engine timings, so that the stored figures are the answer's, not the wall clock's). On
the way, operators act through the same functions (a pinned weight, a thresholds change, a release,
a manual quarantine, an approved and a rejected proposal with its silence, a retired node), a DCGM
page of ``tests/fixtures/dcgm`` is recorded for one node and a few malformed records are refused.

The database named by ``DATABASE_URL`` must have no table (``--recreate`` drops and re-creates it);
the script migrates it. The Redis database number of ``REDIS_URL`` must be empty (``--recreate``
flushes that number only). Ids are then the same from run to run (one process, one thread writes).

What is normalised before hashing (:data:`VOLATILE`): CSRF tokens (the forms' and the Swagger page's:
a new mask on every response), CSP nonces (new on every response) and ``/readyz``'s ``"ms"`` (how
long each check took: the wall clock, which does not freeze). Nothing else: the clock is frozen for
the whole run, the session and CSRF cookies are headers, not bodies, ids are deterministic on a
fresh database, and what expires on a clock the freeze does not stop follows the fixture's clock
instead: the canary's guards (:class:`ProbeGuards`, Redis's clock) and ingest's node directory (the
monotonic clock). Left out of the requests:
``/metrics`` (the process's CPU and memory), ``/admin/`` (Django's own pages), ``/favicon.ico`` (a
redirect to a static file) and the routes that take POST only (ingest, the overrides, the decisions,
``accounts/logout/``). The one POST requested is the thresholds preview (it changes nothing: a replay of
the stored history under other thresholds), since it is the API face of
:mod:`outlier_admin.history.preview`. Every GET route of the URL conf that no request reaches is
printed to stderr."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The frozen clock's start; the fixture runs TICKS * TICK_EVERY_S seconds from here.
T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)
TICKS = 36
TICK_EVERY_S = 5.0
SEED = 20260302
ACTOR = "system:fingerprint"
#: (pattern, replacement) applied to every body before hashing: values that change per request.
VOLATILE = (
    (re.compile(rb'(name="csrfmiddlewaretoken" value=")[^"]+(")'), rb"\1<csrf>\2"),
    (re.compile(rb'("csrfToken"\s*:\s*")[^"]+(")'), rb"\1<csrf>\2"),
    (re.compile(rb'(<meta name="csrf-token" content=")[^"]+(")'), rb"\1<csrf>\2"),
    (re.compile(rb'(\["X-CSRFTOKEN"\] = ")[^"]+(")'), rb"\1<csrf>\2"),  # the Swagger page's script
    (re.compile(rb'( nonce=")[^"]+(")'), rb"\1<nonce>\2"),  # a CSP nonce: new on every response
    (re.compile(rb'("ms":)[0-9.e+-]+'), rb"\1<ms>"),  # /readyz: how long each check took (wall clock)
)
ENV = {
    "DJANGO_SETTINGS_MODULE": "outlier_admin.settings", "OUTLIER_TESTING": "1", "DJANGO_DEBUG": "0",
    "SECRET_KEY": "api-fingerprint-fixed-key", "LOG_LEVEL": "CRITICAL", "LOG_JSON": "0",
    "CELERY_TASK_ALWAYS_EAGER": "1", "ALLOWED_HOSTS": "testserver",
}


# --- a fresh database and Redis ----------------------------------------------------------------

def fresh_services(recreate: bool) -> None:
    """Make the database of ``DATABASE_URL`` and the Redis number of ``REDIS_URL`` empty (module
    docstring), or refuse; then migrate."""
    import dj_database_url
    import psycopg
    import redis
    from psycopg import sql

    url = os.environ.get("DATABASE_URL", "")
    db = dj_database_url.parse(url) if url else {}
    if not db.get("ENGINE", "").endswith("postgresql"):
        raise SystemExit("DATABASE_URL must name a PostgreSQL database")
    conninfo = {"host": db["HOST"] or "127.0.0.1", "port": db["PORT"] or 5432, "user": db["USER"],
                "password": db["PASSWORD"] or None}
    with psycopg.connect(dbname="postgres", autocommit=True, **conninfo) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone()
        if exists and recreate:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db["NAME"])))
        if not exists or recreate:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
    with psycopg.connect(dbname=db["NAME"], **conninfo) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]
    if tables:
        raise SystemExit(f"database {db['NAME']} has {tables} tables: not fresh (--recreate drops it)")
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    if r.dbsize():
        if not recreate:
            raise SystemExit("the Redis database of REDIS_URL is not empty (--recreate flushes that number)")
        r.flushdb()

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


# --- the fixture -------------------------------------------------------------------------------

def canary_stand_in() -> Any:
    """An ``httpx`` transport answering every probe as a fast llama.cpp server (its own timings)."""
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        n = int(body.get("max_tokens") or 16)
        return httpx.Response(200, json={
            "content": " 1, 2, 3", "timings": {"prompt_n": 10, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": 2.0},
            "usage": {"prompt_tokens": 10, "completion_tokens": n}})

    return httpx.MockTransport(answer)


@contextmanager
def canary_through(transport: Any) -> Iterator[None]:
    from outlier_admin.control import canary

    saved = canary.guarded_transport
    canary.guarded_transport = lambda *a, **k: transport
    try:
        yield
    finally:
        canary.guarded_transport = saved


class ProbeGuards:
    """The canary's one-probe-per-node guards on the fixture's clock. The canary task lets a node's
    guard expire in Redis after the group's canary interval, on Redis's own clock, which the frozen
    clock does not stop: the probes of a run then depended on how fast it ran. Here a new guard is
    made persistent (:meth:`hold`) and deleted once the interval has passed on the fixture's clock
    (:meth:`release_due`)."""

    def __init__(self, groups: list[str]) -> None:
        from outlier_admin.control.redis_conn import get_redis
        from outlier_admin.fleet.models import ModelGroup

        self.r = get_redis()
        self.interval = {g: ModelGroup.objects.get(name=g).thresholds().canary_interval_s for g in groups}
        self.since: dict[bytes, tuple[str, float]] = {}

    def hold(self, now: float) -> None:
        from contract import keys

        for g in self.interval:
            for key in self.r.scan_iter(match=keys.probe_inflight(g, "*")):
                if key not in self.since and self.r.persist(key):
                    self.since[key] = (g, now)

    def release_due(self, now: float) -> None:
        for key, (g, at) in list(self.since.items()):
            if now - at >= self.interval[g]:
                self.r.delete(key)
                del self.since[key]


def _feed(group: str, names: list[str], t: float, rng: Any, slow: dict[int, float]) -> None:
    from harness.records import make_records
    from outlier_admin.ingest.pipeline import submit

    recs = make_records(t, group=group, nodes=len(names), per_node=20, slow=slow, rng=rng)
    for rec in recs:
        rec["node"] = names[int(rec["node"].rsplit(":", 1)[1]) - 9000]
    submit([(i + 1, r, None) for i, r in enumerate(recs)], source="fingerprint", now=t)


def _operator_step(k: int, groups: dict[str, Any], nodes: dict[str, list[Any]]) -> None:
    """The operators' part of round ``k`` (module docstring), each through its action."""
    from outlier_admin.control import actions
    from outlier_admin.control.models import QuarantineProposal
    from outlier_admin.fleet.models import Node
    from outlier_admin.ingest.dcgm import record_scrape

    fresh = Node.objects.get
    if k == 8:
        actions.do_pin_weight(fresh(pk=nodes["llama"][6].pk), 50, actor="alice", reason="half traffic while we look")
    elif k == 10:
        actions.do_update_thresholds(groups["llama"], {"degrade_z": 2.2}, actor="bob", reason="fewer soft cuts")
    elif k == 14:
        page = (ROOT / "tests/fixtures/dcgm/datadog-dcgm-metrics.txt").read_text()
        record_scrape(fresh(pk=nodes["qwen"][4].pk), page)
    elif k == 16:
        for p in QuarantineProposal.objects.filter(status="pending").order_by("pk"):
            actions.do_approve_proposal(p, actor="carol", reason="confirmed slow")
    elif k == 18:
        # As the DCGM scrape files one on a hard fault (the recorded page above has none).
        actions.do_propose_quarantine(fresh(pk=nodes["qwen"][4].pk), actor="system:dcgm", source="gpu_fault",
                                      reason="GPU hard fault: gpu0:pcie_link_gen", evidence={"gpus": {}})
    elif k == 19:
        for p in QuarantineProposal.objects.filter(status="pending").order_by("pk"):
            actions.do_reject_proposal(p, actor="carol", reason="known, vendor ticket", silence_s=1800)
    elif k == 20:
        actions.do_quarantine(fresh(pk=nodes["llama"][7].pk), actor="alice", reason="driver update",
                              expires_in_s=900)
    elif k == 24:
        actions.do_release(fresh(pk=nodes["llama"][3].pk), actor="alice", reason="GPU swapped")
        actions.do_unpin_weight(fresh(pk=nodes["llama"][6].pk), actor="alice", reason="done")
    elif k == 30:
        actions.do_retire_node(fresh(pk=nodes["qwen"][5].pk), actor="bob", reason="decommissioned")


def build_fixture(traveller: Any) -> dict[str, Any]:
    """Build the fixture (module docstring) with the clock at :data:`T0` onwards; returns the names
    and ids the requests need."""
    import numpy as np

    from outlier_admin.control import actions
    from outlier_admin.control.canary import run_due_probes
    from outlier_admin.control.tick import run_tick
    from outlier_admin.fleet.roles import ROLES
    from outlier_admin.ingest.pipeline import directory, submit

    admin = actions.do_create_user("admin", roles=list(ROLES), actor=ACTOR)
    admin.is_staff = admin.is_superuser = True
    admin.save()
    for name, role in (("alice", "oncall"), ("bob", "operator"), ("carol", "operator")):
        actions.do_create_user(name, roles=[role], actor=ACTOR)
    groups = {
        "llama": actions.do_create_group("llama", actor=ACTOR, policy="auto", model_name="Llama-3-70B",
                                         hardware_class="8xH100", tensor_parallel_size=8),
        "qwen": actions.do_create_group("qwen", actor=ACTOR, policy="approval", model_name="Qwen2-72B",
                                        hardware_class="8xA100"),
    }
    nodes = {
        "llama": [actions.do_register_node(groups["llama"], f"127.0.0.1:{9000 + i}", actor=ACTOR) for i in range(8)],
        "qwen": [actions.do_register_node(groups["qwen"], f"127.0.0.2:{9100 + i}", actor=ACTOR,
                                          name=f"qwen-{i:02d}", labels={"rack": f"r{i % 2}"}) for i in range(6)],
    }
    names = {g: [n.name for n in ns] for g, ns in nodes.items()}
    rng = np.random.default_rng(SEED)
    guards = ProbeGuards(list(groups))
    directory_at, directory_ttl_s, directory.ttl_s = T0.timestamp(), directory.ttl_s, math.inf
    with canary_through(canary_stand_in()):
        for k in range(TICKS):
            t = T0.timestamp() + k * TICK_EVERY_S
            traveller.move_to(datetime.fromtimestamp(t, UTC))
            if t - directory_at >= directory_ttl_s:
                # Ingest's node directory is cached for ttl_s on the monotonic clock, which the frozen
                # clock does not stop: a run's refusals of the retired node's records depended on its
                # speed. It is reloaded after ttl_s of the fixture's clock instead (and never on its own).
                directory.clear()
                directory_at = t
            _feed("llama", names["llama"], t, rng, {3: 3.0} if 4 <= k < 22 else {})
            _feed("qwen", names["qwen"], t, rng, {2: 2.5} if k >= 6 else {})
            _operator_step(k, groups, nodes)
            traveller.move_to(datetime.fromtimestamp(t + 0.5, UTC))
            for g in groups:
                run_tick(g, now=t + 0.5)
            guards.release_due(t)
            run_due_probes()
            guards.hold(t)
    end = T0.timestamp() + TICKS * TICK_EVERY_S
    traveller.move_to(datetime.fromtimestamp(end, UTC))
    bad = [{"ts": end, "group": "llama", "node": names["llama"][0], "total_ms": -5},
           {"ts": end, "group": "nope", "node": "x", "total_ms": 10.0, "prompt_tokens": 1, "completion_tokens": 1},
           "not a record"]
    submit([(i + 1, r, None) for i, r in enumerate(bad)], source="fingerprint-bad", now=end)
    return {"names": names, "ids": {g: [n.pk for n in ns] for g, ns in nodes.items()},
            "end": datetime.fromtimestamp(end, UTC)}


# --- the requests ------------------------------------------------------------------------------

def requests_of(fx: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """``(method, path, json body or None)`` for every response fingerprinted, in order."""
    ids, names = fx["ids"], fx["names"]
    slow, quiet, qslow = ids["llama"][3], ids["llama"][1], ids["qwen"][2]
    since = (T0 + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
    until = (T0 + timedelta(seconds=120)).isoformat().replace("+00:00", "Z")
    get: list[str] = ["/api/v1/", "/api/schema/", "/api/schema/?format=json", "/api/docs/"]
    get += ["/api/v1/groups/", "/api/v1/groups/?ordering=-name", "/api/v1/groups/?policy=approval",
            "/api/v1/groups/?limit=1&offset=1", "/api/v1/groups/?retired=false"]
    for g in ("llama", "qwen"):
        get += [f"/api/v1/groups/{g}/", f"/api/v1/groups/{g}/thresholds/", f"/api/v1/groups/{g}/thresholds/history/",
                f"/api/v1/groups/{g}/nodes/{names[g][2]}/", f"/api/v1/groups/{g}/nodes/{names[g][3]}/?signal=decode"]
    get += ["/api/v1/nodes/", "/api/v1/nodes/?group=llama", "/api/v1/nodes/?state=quarantined",
            "/api/v1/nodes/?signal=decode", "/api/v1/nodes/?signal=prefill&group=qwen",
            "/api/v1/nodes/?ordering=-latest_z", "/api/v1/nodes/?ordering=weight,name", "/api/v1/nodes/?limit=3&offset=2",
            "/api/v1/nodes/?retired=true", "/api/v1/nodes/?address=9003", f"/api/v1/nodes/?name={names['qwen'][2]}",
            "/api/v1/nodes/?signal=nope", "/api/v1/nodes/?nmae=x"]
    for pk in ids["llama"] + ids["qwen"]:
        get += [f"/api/v1/nodes/{pk}/", f"/api/v1/nodes/{pk}/timeline/"]
    get += [f"/api/v1/nodes/{names['qwen'][1]}/", f"/api/v1/nodes/{slow}/timeline/?hours=0.05",
            f"/api/v1/nodes/{slow}/timeline/?signal=decode&max_points=10",
            f"/api/v1/nodes/{slow}/timeline/?start={since}&end={until}", f"/api/v1/nodes/{slow}/timeline/?max_points=0",
            f"/api/v1/nodes/{slow}/timeline/?start={until}&end={since}", "/api/v1/nodes/99999/", "/api/v1/nodes/no-such/"]
    lists = {
        "transitions": ["", "?group=qwen", "?to_state=quarantined", f"?node={names['llama'][3]}&group=llama",
                        f"?node={slow}", f"?since={since}&until={until}", "?limit=5&offset=5", "?reason=z_degrade",
                        "?shadow=false", "?since=yesterday"],
        "incidents": ["", "?open=true", "?open=false", "?group=llama", f"?node={qslow}", f"?since={until}",
                      f"?until={since}", "?outcome=nope", "?limit=1"],
        "proposals": ["", "?status=pending", "?status=approved", "?source=gpu_fault", "?group=qwen", "?limit=1&offset=1"],
        "overrides": ["", "?kind=pin", "?group=llama", f"?node={ids['llama'][7]}"],
        "probes": ["", "?passed=true", "?ok=true", f"?node={slow}", "?group=qwen", f"?since={until}", "?limit=3&offset=3"],
        "gpu-readings": ["", "?gpu=0", "?group=qwen", f"?node={ids['qwen'][4]}"],
        "audit": ["", "?actor=alice", "?action=node.", "?action=proposal", "?group=llama", f"?node={slow}",
                  f"?since={since}", "?limit=10&offset=10", "?ordering=at"],
        "rejected-input": ["", "?source=fingerprint-bad", "?reason=bad_value", "summary/"],
        "silences": ["", "?active=true", "?active=false", "?group=qwen", "?cause=detector"],
    }
    for name, queries in lists.items():
        get += [f"/api/v1/{name}/{q}" for q in queries]
        get.append(f"/api/v1/{name}/1/")
    get += ["/api/v1/incidents/export/", "/api/v1/incidents/export/?group=llama", "/api/v1/nope/", "/api/v1/groups/nope/"]
    get += ["/", "/groups/llama/", "/groups/qwen/", "/groups/llama/?sort=name", "/groups/llama/?sort=z",
            "/groups/llama/?partial=heatmap", "/groups/llama/?partial=nodes", "/groups/llama/?signal=decode",
            "/groups/llama/?page=2", "/groups/llama/thresholds/", "/groups/qwen/thresholds/", "/groups/llama/policy/"]
    for pk in ids["llama"] + ids["qwen"]:
        get.append(f"/nodes/{pk}/")
    get += [f"/nodes/{slow}/?hours=0.05", f"/nodes/{slow}/?signal=decode", f"/nodes/{qslow}/?hours=2",
            f"/nodes/{quiet}/?start={since}&end={until}", f"/nodes/{slow}/override/", f"/nodes/{slow}/override/?action=pin",
            f"/nodes/{slow}/retire/", "/approvals/", "/approvals/1/decide/", "/silences/1/expire/", "/canary/",
            "/audit/", "/audit/?actor=alice", "/audit/?group=qwen&page=2", "/audit/?page=2", "/audit/export.csv",
            "/audit/export.csv?action=node.", "/transitions/export.csv", "/transitions/export.csv?group=qwen",
            "/rejected/", "/rejected/?hours=1", "/accounts/lockouts/", "/accounts/login/", "/healthz", "/readyz"]
    out: list[tuple[str, str, dict[str, Any] | None]] = [("GET", p, None) for p in get]
    out += [("POST", "/api/v1/groups/llama/thresholds/preview/", {"changes": {"degrade_z": 3.0}, "window_s": 600}),
            ("POST", "/api/v1/groups/qwen/thresholds/preview/", {"changes": {"quarantine_z": 2.5}, "window_s": 3600})]
    return out


def normalised(body: bytes) -> bytes:
    for pattern, repl in VOLATILE:
        body = pattern.sub(repl, body)
    return body


SVG = re.compile(rb"<svg\b.*?</svg>", re.S)


def response_name(method: str, path: str) -> str:
    """A file name for a response: the method and the path, every run of other characters one ``_``."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", f"{method} {path}").strip("_")


def fetch_all(reqs: list[tuple[str, str, dict[str, Any] | None]]) -> dict[str, bytes]:
    """Each request's fingerprinted bytes (status, content type, normalised body), as the admin; the
    inline SVG charts of each node page are listed again on their own (``...#svgN``)."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username="admin"))
    out: dict[str, bytes] = {}
    for method, path, data in reqs:
        if method == "GET":
            resp = client.get(path)
        else:
            resp = client.post(path, data=json.dumps(data), content_type="application/json")
        body = normalised(b"".join(resp.streaming_content) if resp.streaming else resp.content)
        name = response_name(method, path)
        out[name] = f"{resp.status_code} {resp.get('Content-Type', '')}\n".encode() + body
        if path.startswith("/nodes/") and resp.get("Content-Type", "").startswith("text/html"):
            for i, svg in enumerate(SVG.findall(body)):
                out[f"{name}#svg{i}"] = svg
    return out


def uncovered_routes(paths: list[str]) -> list[str]:
    """The URL conf's routes (outside ``/admin/``) that none of ``paths`` resolves to."""
    from django.urls import URLPattern, URLResolver, get_resolver, resolve

    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for p in patterns:
            if isinstance(p, URLResolver):
                if str(p.pattern) != "admin/":
                    yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern).removeprefix("^"), p.callback  # as ResolverMatch.route joins them

    # A viewset's route without GET, and DRF's ``.<format>`` twin of a route, are not asked for.
    routes = {route for route, view in walk(get_resolver().url_patterns, "")
              if "get" in getattr(view, "actions", {"get": None}) and "(?P<format>" not in route}
    return sorted(routes - {resolve(path.split("?")[0]).route for path in paths})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the response bodies here")
    parser.add_argument("--recreate", action="store_true",
                        help="drop and re-create DATABASE_URL's database and flush REDIS_URL's number first")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's code, whatever else is installed
    os.environ.update(ENV)
    import time_machine

    fresh_services(args.recreate)
    with time_machine.travel(T0, tick=False) as traveller:
        fx = build_fixture(traveller)
        reqs = requests_of(fx)
        bodies = fetch_all(reqs)
        missing = uncovered_routes([p for _, p, _ in reqs])
    for route in missing:
        print(f"not requested: {route}", file=sys.stderr)
    hashes = {name: hashlib.sha256(b).hexdigest() for name, b in bodies.items()}
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for name, b in bodies.items():
            (args.keep / name).write_bytes(b)
    for name, h in hashes.items():
        print(f"{h}  {name}")
    total = hashlib.sha256("".join(f"{k} {v}\n" for k, v in hashes.items()).encode()).hexdigest()
    print(f"{total}  (total of {len(hashes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
