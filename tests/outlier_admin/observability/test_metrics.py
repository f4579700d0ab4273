from __future__ import annotations

import time
from types import SimpleNamespace

import orjson
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from outlier_admin.control import publish
from outlier_admin.control.models import CanaryProbe, GroupBaseline, NodeHistory
from outlier_admin.fleet.models import Node
from outlier_admin.observability import hooks, metrics


def scrape(client) -> dict[tuple[str, tuple], float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(resp.content.decode()):
        for s in fam.samples:
            assert s.name.startswith("outlier_"), s.name
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_fleet_state_is_read_from_the_database_and_the_weights_document(client, fleet, redis_client):
    group, nodes = fleet
    Node.objects.filter(pk=nodes[0].pk).update(state="quarantined", weight=0)
    Node.objects.filter(pk__in=[n.pk for n in nodes[1:]]).update(state="healthy", weight=100)
    now = timezone.now()
    # EMAs 1.0, 1.1, 1.3 on the healthy nodes; the quarantined node (9.0) is not in the baseline.
    for node, ema, z in zip(nodes, [9.0, 1.0, 1.1, 1.3], [40.0, -0.5, 0.0, 1.5], strict=True):
        NodeHistory.objects.create(node=node, signal="norm", at=now, ema=ema, z=z, weight=0, state="x")
    view = [{"node": n.name, "address": n.address, "weight": 0 if i == 0 else 100,
             "state": "quarantined" if i == 0 else "healthy"} for i, n in enumerate(nodes)]
    # The detector's baseline of that tick, as stored with the history (not the median of the rows
    # /metrics happens to see: it used to recompute that, 1.1 here, instead of the detector's 1.17).
    GroupBaseline.objects.create(group=group, signal="norm", at=now, baseline=1.17, spread=0.05, peers=3)
    version = publish.publish_weights(group, view, safeguard=True, now=time.time() - 3.0)
    CanaryProbe.objects.create(node=nodes[0], ok=True, passed=True)
    CanaryProbe.objects.create(node=nodes[0], ok=False, passed=False)
    CanaryProbe.objects.create(node=nodes[0], ok=True)

    m = scrape(client)
    g = ("group", "obs-g")
    assert m[("outlier_node_weight", (g, ("node", "n0")))] == 0
    assert m[("outlier_node_weight", (g, ("node", "n1")))] == 100
    assert m[("outlier_node_state", (g, ("node", "n0"), ("state", "quarantined")))] == 1
    assert m[("outlier_node_state", (g, ("node", "n0"), ("state", "healthy")))] == 0
    assert m[("outlier_group_nodes", (g, ("state", "healthy")))] == 3
    assert m[("outlier_group_nodes", (g, ("state", "quarantined")))] == 1
    assert m[("outlier_node_z", (g, ("node", "n0"), ("signal", "norm")))] == 40.0
    assert m[("outlier_node_ema", (g, ("node", "n3"), ("signal", "norm")))] == 1.3
    assert m[("outlier_group_baseline", (g, ("signal", "norm")))] == 1.17
    assert m[("outlier_group_safeguard", (g,))] == 1
    assert m[("outlier_weights_version", (g,))] == version
    assert 2.5 < m[("outlier_weights_age_seconds", (g,))] < 30
    assert m[("outlier_canary_probes_total", (g, ("verdict", "passed")))] == 1
    assert m[("outlier_canary_probes_total", (g, ("verdict", "failed")))] == 1
    assert m[("outlier_canary_probes_pending", (g,))] == 1


def test_fleet_metrics_still_served_when_redis_is_down(client, fleet):
    import redis

    from outlier_admin.control import redis_conn

    redis_conn.set_redis(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2))
    try:
        m = scrape(client)
    finally:
        redis_conn.set_redis(None)
    assert m[("outlier_group_nodes", (("group", "obs-g"), ("state", "warming")))] == 4


def _value(name: str, **labels: str) -> float:
    return metrics.EVENTS.get_sample_value(name, labels) or 0.0


def test_tick_and_ingest_hooks_count_each_result_once():
    result = SimpleNamespace(group="hook-g", tick_ms=40.0, publish_latency_ms=2.0, samples=17)
    before = _value("outlier_tick_duration_seconds_count", group="hook-g")
    hooks.observe_tick(result)
    hooks.observe_tick(result)  # the same result observed twice (pipeline and demo) counts once
    hooks.observe_tick(None)  # a skipped tick records nothing
    assert _value("outlier_tick_duration_seconds_count", group="hook-g") == before + 1
    assert _value("outlier_tick_samples_total", group="hook-g") >= 17
    assert _value("outlier_tick_duration_seconds_bucket", group="hook-g", le="0.05") >= 1

    # Labels are the source's kind (the counters are process-wide: compare with the values before).
    def counts() -> tuple[float, ...]:
        return (_value("outlier_ingest_records_total", source="http", result="accepted"),
                _value("outlier_ingest_records_total", source="http", result="duplicate"),
                _value("outlier_ingest_records_total", source="http", result="rejected"),
                _value("outlier_ingest_rejected_total", source="http", reason="bad_ts"),
                _value("outlier_ingest_rejected_total", source="http", reason="unlisted"),
                _value("outlier_ingest_rejected_total", source="logs", reason="missing_ts"))

    before = counts()
    outcome = SimpleNamespace(accepted=10, duplicates=2, rejected=25,
                              errors=[{"line": i, "reason": "bad_ts"} for i in range(20)])
    hooks.observe_ingest(outcome, source="http:gw-hook")
    hooks.observe_ingest(outcome, source="http:gw-hook")
    exact = SimpleNamespace(accepted=0, duplicates=0, rejected=3, errors=[])
    hooks.observe_ingest(exact, source="log:x", rejected_by_reason={"missing_ts": 2, "bad_status": 1})
    # Only 20 reasons are listed in the response; the 5 others are counted (unlisted), not invented.
    assert [a - b for a, b in zip(counts(), before, strict=True)] == [10, 2, 25, 20, 5, 2]


@pytest.mark.parametrize(("source", "label"), [
    ("http:gw-secret-name", "http"), ("log:edge-nginx", "logs"), ("metrics:127.0.0.1:8000", "scrape"),
    ("dcgm:n1", "scrape"), ("demo-gateway:llama", "demo"), ("test", "other"), ("", "other"),
    ("https:x", "other"), ("http", "http"),
])
def test_ingest_source_labels_are_a_closed_set(source, label):
    assert hooks.source_label(source) == label


@pytest.mark.services
def test_no_token_name_in_metrics_after_an_http_ingest(client, fleet, redis_client):
    """The ingest token's name is in the rejected-input rows (SQL), never in a label of /metrics."""
    from outlier_admin.control.actions import do_create_token
    from outlier_admin.ingest.models import RejectedInput

    group, nodes = fleet
    _, plaintext = do_create_token(name="gw-secret-name", scope="ingest", actor="test")
    good = {"ts": time.time(), "node": nodes[0].name, "group": group.name, "prompt_tokens": 100,
            "completion_tokens": 50, "ttft_ms": 120.0, "total_ms": 900.0, "status": 200}
    body = orjson.dumps([good, {**good, "node": nodes[1].name}, {**good, "total_ms": -1.0}])
    before = _value("outlier_ingest_records_total", source="http", result="accepted")
    resp = client.post("/api/v1/ingest/requests", data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert resp.status_code == 200 and (resp.json()["accepted"], resp.json()["rejected"]) == (2, 1)

    text = client.get("/metrics").content.decode()
    assert "gw-secret-name" not in text
    sources = {s.labels["source"] for fam in text_string_to_metric_families(text)
               if fam.name.startswith("outlier_ingest") for s in fam.samples}
    assert sources <= {"http", "logs", "scrape", "demo", "other"} and "http" in sources
    assert scrape(client)[("outlier_ingest_records_total", (("result", "accepted"), ("source", "http")))] == before + 2
    assert RejectedInput.objects.get().source == "http:gw-secret-name"  # kept where the API's roles guard it


def test_sql_up_is_1_when_the_fleet_state_was_read(client, fleet):
    assert scrape(client)[("outlier_metrics_sql_up", ())] == 1


def test_multiprocess_mode_sums_counters_written_by_separate_processes(tmp_path):
    import subprocess
    import sys

    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "outlier_admin.settings",
           "PATH": "/usr/bin:/bin"}
    bump = ("from outlier_admin.observability import metrics; "
            "metrics.INGEST_RECORDS.labels('http:mp', 'accepted').inc(7)")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", bump], env=env, check=True, timeout=60)
    out = subprocess.run(
        [sys.executable, "-c", "from outlier_admin.observability import metrics; "
                               "print(metrics.render(fleet=False).decode())"],
        env=env, check=True, timeout=60, capture_output=True, text=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("outlier_ingest_records_total{"))
    assert float(line.split()[-1]) == 14.0
