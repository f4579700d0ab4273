"""Property-based fuzzing of the HTTP surface from its OpenAPI schema (schemathesis), and of the ingest
endpoint's record-by-record contract (hypothesis).

Contract under test: no request gets a 5xx (the storage is up here, so not even a 503); every response
is documented in the schema, with a body of the documented shape; the ingest endpoint answers a body
it can read 200 with ``accepted + rejected + duplicates`` = its number of records, every rejected
record stored as a ``RejectedInput`` and every accepted one written to the group's Redis stream.

The schema is the one the app serves at ``/api/schema/`` (drf-spectacular's generator with our hooks,
so the ingest endpoint added by :mod:`outlier_admin.api.schema` is fuzzed too; a test checks that the
served document is this one). Requests go through the real WSGI
handler (middleware, authentication, exception handling) on the real PostgreSQL and Redis, as a user
holding every role (``viewer``, ``operator``, ``oncall``: every endpoint, reads and writes, is
reachable) with an API token, and with an ingest token for the ingest endpoint. Each request runs in a
savepoint rolled back afterwards: every example sees the same world (reproducible, shrinkable), and a
database error in one request cannot poison the next.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, User
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from contract import keys
from contract.normalize import MIN_LATENCY_MS
from contract.stream import decode_requests
from outlier_admin.control.actions import (
    do_create_group,
    do_create_token,
    do_pin_weight,
    do_propose_quarantine,
    do_register_node,
)
from outlier_admin.control.models import AuditEvent, CanaryProbe, NodeHistory, Override, Transition
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.ingest.models import GpuReading, RejectedInput
from outlier_admin.ingest.rejected import refusal_count

pytestmark = [pytest.mark.django_db, pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(240)]

INGEST_PATH = "/api/v1/ingest/requests"
GROUP = "llama"
NODES = [f"127.0.0.{i}:8000" for i in range(1, 5)]
#: Generated examples per operation in the fuzzing phase (the coverage phase adds its own boundary
#: cases): 30 operations x 20, ~1,400 coverage cases and the ingest test take about a minute on 2 cores.
EXAMPLES = int(os.environ.get("FUZZ_API_EXAMPLES", "20"))
INGEST_EXAMPLES = 3 * EXAMPLES
#: Fixed, so that CI is reproducible; set FUZZ_API_SEED to explore other inputs locally.
SEED = int(os.environ.get("FUZZ_API_SEED", "20260131"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


# --- the world the fuzzer acts on ---------------------------------------------------------------------


@pytest.fixture
def _keep_test_connection() -> Iterator[None]:
    """Requests here go through the real WSGI handler, whose request signals close "old" database
    connections: inside the test's transaction that would close the connection under the test. Django's
    own test client disconnects the same handler for the same reason."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(db, redis_client, ingest_token: str, _keep_test_connection: None) -> dict[str, Any]:
    """A group with nodes on 127.0.0.x only, history, a transition, a pending proposal, an override, a
    probe and a GPU reading (so every detail endpoint has a real object to find), a user holding every
    role and its API token, and an ingest token."""
    group = do_create_group(GROUP, actor="setup", policy="approval")
    nodes = [do_register_node(group, address, actor="setup") for address in NODES]
    now = timezone.now()
    NodeHistory.objects.bulk_create([
        NodeHistory(node=node, signal="norm", at=now - timedelta(seconds=10 * k), ema=1.0 + 0.1 * i,
                    z=0.5 * i, p50=1.0, p99=2.0, samples=10 + k, weight=100.0, state="healthy")
        for i, node in enumerate(nodes) for k in range(30)
    ])
    Transition.objects.create(group=group, node=nodes[0], at=now - timedelta(minutes=2),
                              from_state="healthy", to_state="degraded", reason="z_degrade", signal="norm",
                              z=2.4, baseline=1.0, ema=1.6, explanation={"detail": "Z 2.4 >= degrade_z 2.0"})
    proposal = do_propose_quarantine(nodes[1], actor="system:detector", source="detector",
                                     reason="z_quarantine")
    override = do_pin_weight(nodes[2], 50, actor="setup", reason="fuzz fixture")
    CanaryProbe.objects.create(node=nodes[0], ok=True, status=200, total_ms=120.0, prompt_tokens=8,
                               completion_tokens=4)
    GpuReading.objects.create(node=nodes[0], gpu="0", temperature_c=60.0, pcie_link_gen=4)
    user = User.objects.create_user(username="fuzzer", password=None)  # signs in with its token only
    user.groups.add(*Group.objects.filter(name__in=("viewer", "operator", "oncall")))
    _, api_token = do_create_token(name="fuzz-api", scope="api", actor="setup", user=user)
    ids = {
        "nodes": [n.pk for n in nodes], "proposals": [proposal.pk], "overrides": [override.pk],
        "transitions": list(Transition.objects.values_list("pk", flat=True)),
        "probes": list(CanaryProbe.objects.values_list("pk", flat=True)),
        "gpu-readings": list(GpuReading.objects.values_list("pk", flat=True)),
        "audit": list(AuditEvent.objects.values_list("pk", flat=True)[:5]),
    }
    REAL_IDS.clear()
    REAL_IDS.update(ids)
    return {"group": group, "api_token": api_token, "ingest_token": ingest_token, "ids": ids}


#: The real objects of the running test's world, by resource (filled by ``world``): the path-parameter
#: hook below reads them at generation time, inside the test.
REAL_IDS: dict[str, list[int]] = {}


def _real_path_parameters(context: Any, path_parameters: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A ``flatmap_path_parameters`` hook: half of the examples address a real object (the group, a
    node, the proposal, ...), so the fuzzer reaches the code behind the 404 as well."""
    path = context.operation.path
    resource = path.removeprefix("/api/v1/").split("/", 1)[0]
    if "{name}" in path:
        real = st.just({**path_parameters, "name": GROUP})
    elif "{id}" in path and REAL_IDS.get(resource):
        real = st.sampled_from(REAL_IDS[resource]).map(lambda pk: {**path_parameters, "id": pk})
    else:
        return st.just(path_parameters)
    return st.one_of(st.just(path_parameters), real)


def _ingest_records_in_window(context: Any, body: Any) -> Any:
    """A ``map_body`` hook for the ingest endpoint: a generated ``ts`` is any number, and a record from
    the year 1970 is only ever rejected ``ts_too_old``. Move numeric timestamps into the retention
    window and, for half of the records, name the real group and node, so that random records also
    reach the group and node resolution, the de-duplication and the stream."""
    if context.operation.path != INGEST_PATH:
        return body
    now, window = time.time(), django_settings.INGEST_RETENTION_S - 60
    for rec in body if isinstance(body, list) else [body]:
        ts = rec.get("ts") if isinstance(rec, dict) else None
        if isinstance(ts, int | float) and not isinstance(ts, bool) and math.isfinite(ts):
            rec["ts"] = now - abs(ts) % window
            if int(ts) % 2 == 0:  # derived from the drawn value: the same example maps the same way
                rec["group"], rec["node"] = GROUP, NODES[int(ts) % len(NODES)]
    return body


def _load_schema() -> Any:
    """The document ``/api/schema/`` serves (drf-spectacular's generator with our hooks; checked by
    ``test_the_served_schema_is_the_fuzzed_one_and_follows_the_settings``), fuzzed through the app's
    WSGI handler. Built at
    collection time, when there is no database to authenticate a GET of ``/api/schema/`` with:
    schemathesis makes one test per operation from it."""
    from drf_spectacular.generators import SchemaGenerator

    config = SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {"max-examples": EXAMPLES, "database": "none"},
        # drf-spectacular declares no links between operations: each one is fuzzed on its own.
        "phases": {"stateful": {"enabled": False}},
        "operations": [{
            # The ingest record's boundaries are the dedicated hypothesis test's below (which knows
            # which records must be accepted); here, random bodies, more of them, and no coverage phase
            # (its ~700 boundary bodies took 13 s).
            "include-path": INGEST_PATH,
            "generation": {"max-examples": INGEST_EXAMPLES},
            "phases": {"coverage": {"enabled": False}},
        }],
    })
    document = SchemaGenerator().get_schema(request=None, public=True)
    loaded = schemathesis.openapi.from_dict(document, config=config)
    loaded.app = get_wsgi_application()
    loaded.hooks.register_hook_with_name(_real_path_parameters, "flatmap_path_parameters")
    loaded.hooks.register_hook_with_name(_ingest_records_in_window, "map_body")
    return loaded


@schemathesis.serializer("application/x-ndjson", "application/ndjson", "application/jsonl",
                         "application/x-jsonlines")
def _ndjson(ctx: Any, value: Any) -> bytes:
    """NDJSON: one JSON document per line (the schema describes the lines as an array of records). The
    standard library's encoder: generated integers may exceed 64 bits, which orjson refuses to write."""
    items = value if isinstance(value, list) else [value]
    return b"\n".join(json.dumps(item).encode() for item in items)


# --- ingest bookkeeping -----------------------------------------------------------------------------------


def _stream_rows(redis_client: Any) -> int:
    """Request rows in every group's stream (an entry carries a batch of rows)."""
    total = 0
    for key in redis_client.scan_iter(match=keys.stream("*")):
        total += sum(len(decode_requests(fields)) for _, fields in redis_client.xrange(key))
    return total


def _count_items(body: bytes, content_type: str) -> int | None:
    """The number of records in a body, as the endpoint's contract counts them: the elements of a JSON
    array, 1 for a JSON object, else the non-empty lines (NDJSON). None: not a body of records."""
    if content_type == "application/json":
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            return len(doc) if isinstance(doc, list) else 1 if isinstance(doc, dict) else None
    return sum(1 for line in body.split(b"\n") if line.strip())


def _check_ingest_outcome(response: Any, *, body: bytes, content_type: str, rejected_rows: int,
                          stream_rows: int) -> None:
    if response.status_code != 200:
        return
    out = orjson.loads(response.content)
    items = _count_items(body, content_type)
    assert out["accepted"] + out["rejected"] + out["duplicates"] == items, (out, items)
    assert rejected_rows == out["rejected"], f"{rejected_rows} refusals in RejectedInput rows, {out['rejected']} rejected"
    assert stream_rows == out["accepted"], f"{stream_rows} stream rows for {out['accepted']} accepted"


# --- 1. every operation of the schema ---------------------------------------------------------------------

schema = _load_schema()


@schema.parametrize()
@hsettings(suppress_health_check=list(HealthCheck), deadline=None)
def test_every_operation_answers_as_documented_and_never_5xx(case: Any, world: dict[str, Any],
                                                             redis_client: Any) -> None:
    ingest = case.operation.path == INGEST_PATH
    token = world["ingest_token"] if ingest else world["api_token"]
    rejected_before = refusal_count() if ingest else 0
    rows_before = _stream_rows(redis_client) if ingest else 0
    sid = transaction.savepoint()
    try:
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        if ingest:
            sent = response.request.body or b""
            content_type = response.request.headers.get("Content-Type") or ""
            _check_ingest_outcome(
                response, body=sent if isinstance(sent, bytes) else sent.encode(),
                content_type=content_type.split(";")[0].strip().lower(),
                rejected_rows=refusal_count() - rejected_before,
                stream_rows=_stream_rows(redis_client) - rows_before)
    finally:
        transaction.savepoint_rollback(sid)
    case.validate_response(response, checks=CHECKS)


# --- 2. the ingest endpoint: all-or-record-by-record ------------------------------------------------------

FIXED = hsettings(max_examples=150, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large])


RECORD_FIELDS = {"ts", "age_s", "node", "group", "prompt_tokens", "completion_tokens", "ttft_ms", "total_ms",
                 "status", "request_id"}
EXTRA_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@st.composite
def valid_records(draw: st.DrawFn) -> dict[str, Any]:
    """A record every rule accepts (``ts`` is filled in just before sending: the window moves)."""
    max_latency = django_settings.INGEST_MAX_LATENCY_MS
    total = draw(st.floats(MIN_LATENCY_MS, max_latency))
    prompt = draw(st.integers(0, django_settings.INGEST_MAX_PROMPT_TOKENS))
    completion = draw(st.integers(1 if prompt == 0 else 0, django_settings.INGEST_MAX_COMPLETION_TOKENS))
    rec: dict[str, Any] = {
        "age_s": draw(st.floats(0, 3000)), "node": draw(st.sampled_from(NODES)), "group": GROUP,
        "prompt_tokens": prompt, "completion_tokens": completion, "total_ms": total,
        "status": draw(st.sampled_from([0, 100, 200, 404, 500, 599])),
    }
    if draw(st.booleans()):
        rec["ttft_ms"] = draw(st.just(0.0) | st.floats(MIN_LATENCY_MS, total))
    if draw(st.booleans()):  # a small pool, so that some ids repeat (duplicates, within and across batches)
        rec["request_id"] = f"req-{draw(st.integers(0, 40))}"
    # Fields the format does not know are ignored, whatever they hold (NUL included).
    unknown = st.text(max_size=8).filter(lambda k: k not in RECORD_FIELDS)
    rec.update(draw(st.dictionaries(unknown, EXTRA_VALUES, max_size=2)))
    return rec


#: Ways to make a valid record invalid; each one is refused whatever the rest of the record is.
BREAKERS: dict[str, Any] = {
    "total_ms_over": lambda: {"total_ms": django_settings.INGEST_MAX_LATENCY_MS + 1},
    "total_ms_zero": lambda: {"total_ms": 0},
    "total_ms_nan": lambda: {"total_ms": "NaN"},
    "total_ms_inf": lambda: {"total_ms": "1e999"},
    "ttft_over_total": lambda: {"total_ms": 10.0, "ttft_ms": 11.0},
    "ttft_negative": lambda: {"ttft_ms": -1},
    "prompt_over": lambda: {"prompt_tokens": django_settings.INGEST_MAX_PROMPT_TOKENS + 1},
    "completion_over": lambda: {"completion_tokens": django_settings.INGEST_MAX_COMPLETION_TOKENS + 1},
    "prompt_negative": lambda: {"prompt_tokens": -1},
    "prompt_fraction": lambda: {"prompt_tokens": 1.5},
    "no_tokens": lambda: {"prompt_tokens": 0, "completion_tokens": 0},
    "node_nul": lambda: {"node": "127.0.0.1\x00:8000"},
    "group_nul": lambda: {"group": "lla\x00ma"},
    "request_id_nul": lambda: {"request_id": "req\x00"},
    "node_300": lambda: {"node": "n" * 300},
    "group_300": lambda: {"group": "g" * 300},
    "node_url": lambda: {"node": "http://127.0.0.1:8000/v1"},
    "node_int": lambda: {"node": 12345},
    "group_list": lambda: {"group": ["llama"]},
    "tokens_text": lambda: {"prompt_tokens": "many"},
    "total_object": lambda: {"total_ms": {"ms": 5}},
    "status_text": lambda: {"status": "200"},
    "status_bool": lambda: {"status": True},
    "status_out": lambda: {"status": 600},
    "ts_text": lambda: {"ts": "yesterday"},
    "ts_naive": lambda: {"ts": "2026-01-31T12:00:00"},
    "ts_old": lambda: {"ts": 1.0},
    "ts_future": lambda: {"ts": time.time() + 10 * django_settings.INGEST_MAX_FUTURE_S + 3600},
    "ts_missing": lambda: {"ts": None},
    "node_missing": lambda: {"node": None},
    "unknown_group": lambda: {"group": "no-such-group"},
    "unknown_node": lambda: {"node": "gpu-node-zz"},
    "unknown_address": lambda: {"node": "127.0.9.9:8000"},  # auto-registration is off below
}
NOT_RECORDS = [5, "a record", None, [], [1, 2], True]
#: NDJSON lines that are not a record: each is one rejected item (``bad_json`` / ``not_an_object``).
GARBAGE_LINES = [b'{"ts": 1, "node": ', b"\x00\x01 binary", b"\xff\xfe not utf-8", b"[1, 2", b'"a string"',
                 b"null", b"\xc2\xa0", b'{"node": "\\ud800"}']


@st.composite
def items(draw: st.DrawFn) -> tuple[str, Any]:
    """``("valid", record)``, ``("invalid", record)`` or ``("invalid", not-an-object)``."""
    kind = draw(st.sampled_from(["valid", "valid", "broken", "broken", "not_a_record"]))
    if kind == "not_a_record":
        return "invalid", draw(st.sampled_from(NOT_RECORDS))
    rec = draw(valid_records())
    if kind == "valid":
        return "valid", rec
    for name in draw(st.lists(st.sampled_from(sorted(BREAKERS)), min_size=1, max_size=3, unique=True)):
        rec.update(BREAKERS[name]())
    return "invalid", rec


def _finish(obj: Any, now: float) -> Any:
    """Stamp a record's ``ts`` (from its ``age_s``) at sending time, unless a breaker set it."""
    if not isinstance(obj, dict):
        return obj
    rec = dict(obj)
    age = rec.pop("age_s")
    rec.setdefault("ts", now - age)
    return rec


@pytest.fixture
def ingest_world(world: dict[str, Any], settings: Any) -> dict[str, Any]:
    # Production's default: a record never registers a node (so an unknown address is rejected).
    settings.AUTO_REGISTER_NODES = False
    return world


@FIXED
@given(batch=st.lists(items(), min_size=1, max_size=25), ndjson=st.booleans(),
       garbage_lines=st.lists(st.sampled_from(GARBAGE_LINES), max_size=3))
def test_ingest_is_record_by_record_for_any_mix_of_valid_and_invalid(
    client: Any, ingest_world: dict[str, Any], redis_client: Any, batch: list[tuple[str, Any]], ndjson: bool,
    garbage_lines: list[bytes],
) -> None:
    now = time.time()
    records = [_finish(obj, now) for _, obj in batch]
    valid = sum(1 for kind, _ in batch if kind == "valid")
    if ndjson:
        # Lines that are not JSON are records too (rejected ``bad_json``), never a 400 for the batch.
        lines = [orjson.dumps(r) for r in records] + garbage_lines
        body, ctype = b"\n".join(lines), "application/x-ndjson"
        invalid = len(batch) - valid + len(garbage_lines)
    else:
        body, ctype, invalid = orjson.dumps(records), "application/json", len(batch) - valid
    rejected_before, rows_before = refusal_count(), _stream_rows(redis_client)

    resp = client.post(INGEST_PATH, data=body, content_type=ctype,
                       HTTP_AUTHORIZATION=f"Bearer {ingest_world['ingest_token']}")

    assert resp.status_code == 200, resp.content
    out = resp.json()
    assert out["accepted"] + out["rejected"] + out["duplicates"] == valid + invalid
    assert out["rejected"] == invalid, out
    assert out["accepted"] + out["duplicates"] == valid, out
    assert refusal_count() - rejected_before == out["rejected"]
    assert not RejectedInput.objects.filter(reason="").exists(), "every rejection carries its reason"
    assert _stream_rows(redis_client) - rows_before == out["accepted"]
    assert not ModelGroup.objects.exclude(name=GROUP).exists(), "ingest never creates a group"
    assert set(Node.objects.values_list("name", flat=True)) == set(NODES), "nor registers a node here"
    assert Override.objects.count() == 1


def _record(**kw: Any) -> dict[str, Any]:
    return {"ts": time.time(), "node": NODES[0], "group": GROUP, "prompt_tokens": 100,
            "completion_tokens": 20, "total_ms": 900.0, "status": 200, **kw}


def test_ingest_a_number_beyond_a_double_is_one_rejected_record(client: Any, ingest_world: dict[str, Any],
                                                                redis_client: Any) -> None:
    body = b"[" + orjson.dumps(_record()) + b"," + orjson.dumps(_record()).replace(b'"total_ms":900.0',
                                                                                  b'"total_ms":1e400') + b"]"
    resp = client.post(INGEST_PATH, data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {ingest_world['ingest_token']}")
    assert resp.status_code == 200, resp.content
    out = resp.json()
    assert (out["accepted"], out["rejected"]) == (1, 1)
    assert RejectedInput.objects.get().reason == "bad_total_ms"


def test_ingest_a_lone_surrogate_is_one_rejected_record_kept_with_its_escape(
        client: Any, ingest_world: dict[str, Any], redis_client: Any) -> None:
    """Valid JSON that orjson refuses (a lone surrogate escape) used to fail the whole body."""
    bad = orjson.dumps(_record()).replace(b'"status":200', b'"status":200,"request_id":"\\ud800x"')
    body = b"[" + orjson.dumps(_record()) + b"," + bad + b"]"
    resp = client.post(INGEST_PATH, data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {ingest_world['ingest_token']}")
    assert resp.status_code == 200, resp.content
    assert (resp.json()["accepted"], resp.json()["rejected"]) == (1, 1)
    assert "\\ud800" in RejectedInput.objects.get(reason="bad_request_id").raw


# --- 3. inputs that were answered 5xx (or a bare HTML page) before ------------------------------------------

BIG = 10**400  # an integer far beyond a double (the standard library writes it; orjson would refuse)
#: ``(method, path, body, content type, status)``: each found by the fuzzer or by probing around what it
#: found, now a 4xx in the API's one error shape (an RFC 9457 problem). ``{node}``/``{proposal}``:
#: a real object's id.
BAD_INPUTS = [
    ("GET", "/api/v1/transitions/?since=2026-01-01T00:00:00%2B23:14", None, None, 200),  # PG: offset > 15:59
    ("GET", "/api/v1/audit/?until=0001-01-01T00:00:00%2B10:00", None, None, 400),  # before year 1 in UTC
    ("GET", "/api/v1/nodes/{node}/timeline/?start=2026-01-01T00:00:00%2B22:00", None, None, 400),
    ("GET", "/api/v1/nodes/{node}/timeline/?end=0001-01-01T00:30:00Z", None, None, 400),  # end - 1 h < year 1
    ("GET", "/api/v1/nodes/{node}/timeline/?end=2026-02-30T00:00:00Z", None, None, 400),  # no such day
    ("POST", "/api/v1/nodes/null,null/quarantine/", '{"reason": "x"}', "application/json", 404),
    ("GET", "/api/v1/nodes/null,null/timeline/", None, None, 404),
    ("POST", "/api/v1/proposals/1.5/approve/", '{"reason": "x"}', "application/json", 404),
    ("GET", "/api/v1/gpu-readings/4.5e-26/", None, None, 404),  # no route: Django's HTML 404 before
    ("GET", "/api/v1/groups/%C2%84%0A/", None, None, 404),
    ("POST", "/api/v1/groups/a%2Fb/policy/", '{"policy": "auto", "reason": "x"}', "application/json", 404),
    ("GET", "/api/v1/audit/?limit=" + "9" * 20, None, None, 200),  # LIMIT beyond bigint: capped page
    ("PATCH", "/api/v1/groups/llama/thresholds/", json.dumps({"changes": {"degrade_z": BIG}, "reason": "x"}),
     "application/json", 400),
    ("PATCH", "/api/v1/groups/llama/thresholds/",
     json.dumps({"changes": {"quarantine_persistence": BIG}, "reason": "x"}), "application/json", 400),
    ("POST", "/api/v1/groups/llama/thresholds/preview/", json.dumps({"changes": {"degrade_z": BIG}}),
     "application/json", 400),
    # The error quotes the name: a lone surrogate could not be encoded.
    ("PATCH", "/api/v1/groups/llama/thresholds/", '{"changes": {"\\ud800": 1}, "reason": "x"}',
     "application/json", 400),
    ("POST", "/api/v1/groups/llama/policy/", '{"policy": "\\ud800", "reason": "x"}', "application/json", 400),
    ("POST", "/api/v1/nodes/{node}/release/", '{"reason": ' + "[" * 5000 + "]" * 5000 + "}",
     "application/json", 400),  # RecursionError in the JSON parser
    ("POST", "/api/v1/nodes/{node}/release/", '{"reason": "' + "x" * 3_000_000 + '"}', "application/json",
     413),
    # A form of 1,200 fields was a 400 (DATA_UPLOAD_MAX_NUMBER_FIELDS); the API now reads JSON only.
    ("POST", "/api/v1/nodes/{node}/release/", "&".join(f"f{i}=1" for i in range(1200)),
     "application/x-www-form-urlencoded", 415),
    ("POST", "/api/v1/nodes/{node}/release/", "reason=x", "multipart/form-data; boundary=b", 415),
]


@pytest.mark.parametrize(("method", "path", "body", "content_type", "expected"), BAD_INPUTS,
                         ids=[f"{m} {p[:60]}" for m, p, *_ in BAD_INPUTS])
def test_inputs_once_answered_5xx_get_a_clear_answer(world: dict[str, Any], method: str, path: str,
                                                      body: str | None, content_type: str | None,
                                                      expected: int) -> None:
    from werkzeug import Client

    ids = world["ids"]
    path = path.replace("{node}", str(ids["nodes"][0])).replace("{proposal}", str(ids["proposals"][0]))
    headers = {"Authorization": f"Bearer {world['api_token']}"}
    if content_type:
        headers["Content-Type"] = content_type
    # Through the WSGI handler as the fuzzer sends (Django's test client re-raises instead of answering).
    resp = Client(get_wsgi_application()).open(path, method=method, headers=headers,
                                               data=body.encode() if body is not None else None)
    assert resp.status_code == expected, resp.get_data()[:300]
    if expected >= 400:  # an RFC 9457 problem (outlier_admin.api.errors)
        assert resp.mimetype == "application/problem+json"
        problem = orjson.loads(resp.get_data())
        assert problem["status"] == expected and isinstance(problem["detail"], str) and problem["detail"]
        assert problem["errors"] and all(isinstance(e["code"], str) for e in problem["errors"])
    else:
        assert resp.mimetype == "application/json"


# --- 4. the schema itself -----------------------------------------------------------------------------


def test_the_served_schema_is_the_fuzzed_one_and_follows_the_settings(client: Any, world: dict[str, Any],
                                                                     settings: Any) -> None:
    """What ``/api/schema/`` serves is what was fuzzed, and the ingest bounds in it are read from the
    settings and the name rules when the schema is generated (no copy that could drift)."""
    from drf_spectacular.generators import SchemaGenerator

    from contract import names

    def served() -> dict[str, Any]:
        resp = client.get("/api/schema/?format=json", HTTP_AUTHORIZATION=f"Bearer {world['api_token']}")
        assert resp.status_code == 200
        return orjson.loads(resp.content)

    doc = served()
    assert doc == SchemaGenerator().get_schema(request=None, public=True)
    assert INGEST_PATH in schema.raw_schema["paths"], "the ingest endpoint is among the fuzzed operations"
    record = doc["components"]["schemas"]["IngestRecord"]["properties"]
    assert record["node"]["pattern"] == f"^(?:{names.NODE_ID_RE.pattern})$"
    assert record["group"]["pattern"] == f"^(?:{names.GROUP_NAME_RE.pattern})$"
    assert record["total_ms"]["maximum"] == settings.INGEST_MAX_LATENCY_MS
    ingest = doc["paths"][INGEST_PATH]["post"]
    assert ingest["security"] == [{"ingestToken": []}]
    assert {"200", "400", "401", "405", "413", "415", "500", "503"} <= set(ingest["responses"])
    assert "Retry-After" in ingest["responses"]["503"]["headers"]

    settings.INGEST_MAX_LATENCY_MS = 5000
    settings.INGEST_MAX_PROMPT_TOKENS = 77
    record = served()["components"]["schemas"]["IngestRecord"]["properties"]
    # ttft_ms is 0 (not measured) or in its bounds: its maximum is in the bounded branch of its oneOf.
    [ttft_bounds] = [b for b in record["ttft_ms"]["oneOf"] if "maximum" in b]
    assert record["total_ms"]["maximum"] == ttft_bounds["maximum"] == 5000
    assert record["prompt_tokens"]["maximum"] == 77
