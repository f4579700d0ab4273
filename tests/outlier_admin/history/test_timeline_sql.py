"""The database-side downsampling of long ranges (PostgreSQL) must give the same points as the
reference :func:`downsample` over the same rows: same buckets, Z/P99/evidence maxima, weight minima, mean EMA/P50,
last samples/state; missing (NULL) and NaN figures ignored."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.history.timeline import FIELDS, downsample, group_baseline, node_timeline

pytestmark = pytest.mark.django_db


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize(("seed", "rows", "max_points"), [(1, 3000, 500), (2, 1201, 1200), (3, 5000, 7)])
def test_sql_buckets_match_reference_downsample(seed, rows, max_points):
    rng = np.random.default_rng(seed)
    group = do_create_group(f"g{seed}", actor="test")
    node = do_register_node(group, "127.1.0.1:8000", actor="test")
    # Irregular cadence (2-18 s) and a range start not aligned with the rows.
    end = timezone.now()
    ats = end - timedelta(seconds=5) - timedelta(seconds=1) * np.cumsum(rng.uniform(2, 18, rows))[::-1]
    states = np.array(["healthy", "degraded", "quarantined"])
    hist = []
    for i, at in enumerate(ats.tolist()):
        missing = rng.random() < 0.05
        hist.append(NodeHistory(
            node=node, signal="norm", at=at, ema=None if missing else float(rng.normal(1, 0.1)),
            z=float("nan") if rng.random() < 0.05 else float(rng.normal(0, 2)),
            p50=float(rng.uniform(0.5, 1.5)), p99=None if missing else float(rng.uniform(1.5, 4)),
            samples=i * 3, weight=float(rng.choice([0.0, 50.0, 100.0])), state=str(rng.choice(states)),
            evidence=None if rng.random() < 0.3 else float(rng.exponential(4)),
        ))
    NodeHistory.objects.bulk_create(hist)
    start = ats[0] - timedelta(seconds=7.3)

    got = node_timeline(node, start, end, max_points=max_points)
    ref_rows = list(NodeHistory.objects.filter(node=node, signal="norm").order_by("at").values_list(*FIELDS))
    want = downsample(ref_rows, start, end, max_points)

    assert len(got) == len(want) <= max_points
    for g, w in zip(got, want, strict=True):
        assert abs((g.at - w.at).total_seconds()) < 1e-3
        assert (g.z, g.p99, g.weight, g.samples, g.state, g.evidence) == (
            w.z, w.p99, w.weight, w.samples, w.state, w.evidence)
        assert _close(g.ema, w.ema) and _close(g.p50, w.p50)


def test_group_baseline_buckets_mean_finite_values_and_fewest_peers():
    group = do_create_group("gb", actor="test")
    end = timezone.now()
    start = end - timedelta(seconds=1000)
    # 100 rows every 10 s; 10 buckets of 10 rows. Bucket 3 has no finite baseline at all.
    GroupBaseline.objects.bulk_create([
        GroupBaseline(group=group, signal="norm", at=start + timedelta(seconds=10 * i + 1),
                      baseline=None if i // 10 == 3 else 1.0 + i // 10, spread=0.05 * (1 + i % 2), peers=20 - i % 10)
        for i in range(100)
    ])
    GroupBaseline.objects.create(group=group, signal="decode", at=start + timedelta(seconds=5), baseline=9, peers=3)

    points = group_baseline(group.pk, start, end, max_points=10)
    assert len(points) == 10
    assert [p.baseline for p in points] == [1.0, 2.0, 3.0, None, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert all(p.spread == pytest.approx(0.075) and p.peers == 11 for p in points)
    assert points[-1].at == start + timedelta(seconds=991)
    # Fits: returned as stored (the other signal is not mixed in).
    raw = group_baseline(group.pk, start, end, signal="decode")
    assert [(p.baseline, p.peers) for p in raw] == [(9.0, 3)]


def test_timeline_json_is_what_drf_would_have_rendered(fleet, users):
    """The orjson renderer of the timeline must not change a byte of meaning (dates, nulls, nesting)."""
    import json

    from rest_framework.renderers import JSONRenderer
    from rest_framework.test import APIClient

    GroupBaseline.objects.create(group=fleet["group"], signal="norm", at=fleet["now"] - timedelta(minutes=3),
                                 baseline=None, spread=None, peers=2)
    c = APIClient()
    c.force_authenticate(users["viewer"])
    resp = c.get(f"/api/v1/nodes/{fleet['nodes'][0].pk}/timeline/?hours=1")
    assert resp.status_code == 200 and resp["Content-Type"] == "application/json"
    body = json.loads(resp.content)
    assert body == json.loads(JSONRenderer().render(resp.data))
    assert body["end"].endswith("Z") and len(body["transitions"]) == 2 and body["baseline"][0]["baseline"] is None
    assert c.get(f"/api/v1/nodes/{fleet['nodes'][0].pk}/timeline/?hours=x").json()["detail"]
