"""The tick stores the detector's per-group baseline with every history write; retention thins it."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from harness.records import make_records
from outlier_admin.control.actions import do_create_group
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.control.retention import apply_retention
from outlier_admin.control.tick import run_tick
from outlier_admin.ingest.pipeline import submit

pytestmark = pytest.mark.django_db


@pytest.mark.services
def test_tick_stores_the_baseline_every_z_was_measured_against(redis_client, settings, make_group):
    make_group("g1")
    settings.HISTORY_EVERY_S = 1  # every tick below is a history write for every node
    rng = np.random.default_rng(11)
    t0 = time.time()
    for k in range(6):
        recs = make_records(t0 + k, rng=rng, slow={2: 3.0})
        assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
        run_tick("g1", now=t0 + k + 0.5)

    rows = list(GroupBaseline.objects.filter(group__name="g1").order_by("at", "signal"))
    ats = sorted({r.at for r in rows})
    assert len(ats) == 6 and all(at in set(NodeHistory.objects.values_list("at", flat=True)) for at in ats)
    assert {r.signal for r in rows} == set(NodeHistory.objects.values_list("signal", flat=True))
    last = {r.signal: r for r in rows if r.at == ats[-1]}
    norm = last["norm"]
    assert norm.baseline is not None and norm.spread > 0 and 5 <= norm.peers <= 8
    # The stored baseline is the one the detector used: Z = (EMA - baseline) / spread for every node.
    hist = NodeHistory.objects.filter(at=ats[-1], signal="norm", z__isnull=False)
    assert hist.count() >= 5
    for h in hist:
        assert math.isclose(h.z, (h.ema - norm.baseline) / norm.spread, rel_tol=1e-9, abs_tol=1e-9)
    # The gray node (3x from the first second) is quarantined by now (1 s of persistence over 3
    # evaluations once its EMA is over the line): no Z, and it no longer pulls the baseline up.
    slow = NodeHistory.objects.get(at=ats[-1], signal="norm", node__name="127.0.0.1:9002")
    assert slow.state == "quarantined" and slow.z is None and slow.ema > 1.4 * norm.baseline
    assert 0.9 < norm.baseline < 1.1


def test_retention_thins_old_baselines_to_one_per_hour_and_drops_expired(settings):
    settings.HISTORY_RAW_DAYS, settings.HISTORY_KEEP_DAYS = 2, 30
    group = do_create_group("ret", actor="test")
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    old_hour = now - timedelta(days=3)
    rows = [GroupBaseline(group=group, signal=sig, at=old_hour + timedelta(minutes=m), baseline=1.0 + m, peers=8)
            for sig in ("norm", "decode") for m in range(0, 20, 2)]  # 10 rows per signal in one hour
    rows += [GroupBaseline(group=group, signal="norm", at=now - timedelta(days=40), baseline=1.0, peers=8),
             GroupBaseline(group=group, signal="norm", at=now - timedelta(minutes=5), baseline=1.0, peers=8)]
    GroupBaseline.objects.bulk_create(rows)

    out = apply_retention(now)
    assert out["baseline_dropped"] == 1 and out["baseline_thinned"] == 18
    kept = list(GroupBaseline.objects.filter(at__lt=now - timedelta(days=2)).order_by("signal"))
    assert [(k.signal, k.baseline, k.downsampled) for k in kept] == [("decode", 19.0, True), ("norm", 19.0, True)]
    assert GroupBaseline.objects.filter(at__gte=now - timedelta(days=2), downsampled=False).count() == 1
    assert apply_retention(now)["baseline_thinned"] == 0  # idempotent
