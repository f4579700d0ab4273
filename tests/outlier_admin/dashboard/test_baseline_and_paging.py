"""Group page: the nodes table is sorted over the whole group, then paginated; the baseline shown is
the detector's stored one. Node page and threshold preview use the stored baseline too."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from outlier_admin.control.actions import do_register_node
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.dashboard.views import GROUP_PAGE_SIZE
from outlier_admin.history.preview import preview_thresholds
from tests.outlier_admin.api.conftest import write_history

pytestmark = pytest.mark.django_db


def viewer(users) -> Client:
    c = Client()
    c.force_login(users["viewer"])
    return c


def store_baseline(group, ats, value: float, spread: float = 0.05, peers: int = 7) -> None:
    GroupBaseline.objects.bulk_create([GroupBaseline(group=group, signal="norm", at=at, baseline=value,
                                                     spread=spread, peers=peers) for at in ats])


def decides_on(group, signal: str) -> None:
    """What a tick stores once the detector decides ``group`` on ``signal`` (its Evaluation's)."""
    group.decision_signal = signal
    group.save(update_fields=["decision_signal"])


def test_group_table_sorts_all_nodes_then_pages(fleet, users):
    group, now = fleet["group"], fleet["now"]
    extra = [do_register_node(group, f"127.0.9.{i}:8000", actor="setup") for i in range(GROUP_PAGE_SIZE)]
    # One of the new nodes has the highest Z of the group: it must lead page 1 sorted by -z although
    # by name it sorts after the first page.
    write_history(extra[-1], start=now - timedelta(seconds=30), count=3, z=7.5, ema=2.5)
    c = viewer(users)
    total = 8 + GROUP_PAGE_SIZE
    page1 = c.get(f"/groups/{group.name}/?sort=-z").content.decode()
    assert page1.count('class="row-') == GROUP_PAGE_SIZE
    assert f"{total} nodes, sorted by -z, showing 1–{GROUP_PAGE_SIZE}" in page1
    rows = re.findall(r'<th scope="row"><a href="/nodes/\d+/">([^<]+)</a>', page1)
    assert rows[:2] == [extra[-1].name, "127.0.0.0:8000"]  # Z 7.5, then 4.2
    assert "page=1" in page1 and 'rel="next"' in page1 and 'href="?sort=-z&amp;page=2"' in page1
    page2 = c.get(f"/groups/{group.name}/?sort=-z&page=2&partial=nodes").content.decode()
    assert page2.count('class="row-') == total - GROUP_PAGE_SIZE and "<html" not in page2
    names2 = re.findall(r'<th scope="row"><a href="/nodes/\d+/">([^<]+)</a>', page2)
    assert not set(names2) & set(rows)
    # Nodes without any figure come last, in name order, whatever the direction.
    assert names2 == sorted(names2) and all(n.startswith("127.0.9.") for n in names2)
    # An unknown sort key or page number falls back instead of failing.
    assert c.get(f"/groups/{group.name}/?sort=bogus&page=99").status_code == 200


def test_group_page_shows_the_stored_detector_baseline(fleet, users):
    c = viewer(users)
    group = fleet["group"]
    assert "not recorded yet" in c.get(f"/groups/{group.name}/").content.decode()
    store_baseline(group, [fleet["now"] - timedelta(seconds=20)], 1.234, spread=0.061, peers=7)
    store_baseline(group, [fleet["now"] - timedelta(seconds=10)], 1.042, spread=0.052, peers=6)
    html = c.get(f"/groups/{group.name}/").content.decode()
    # In the unit of the signal's EMA (the fleet's norm: x the cost model's expectation).
    assert "1.042 ± 0.052 x expected (median ± robust spread σ) over 6 peers" in html and "1.234" not in html


def test_node_chart_draws_stored_baseline_and_degrade_bound(fleet, users):
    group, node, now = fleet["group"], fleet["nodes"][0], fleet["now"]
    html = viewer(users).get(f"/nodes/{node.pk}/").content.decode()
    assert "peer baseline (detector): no data" in html
    ats = [now - timedelta(minutes=30) + timedelta(seconds=10 * i) for i in range(180)]
    store_baseline(group, ats, 1.25, spread=0.05)
    html = viewer(users).get(f"/nodes/{node.pk}/").content.decode()
    # Latest values are stated in the chart's accessible description: baseline and baseline + 2.0 x spread.
    assert "peer baseline (detector) 1.25 x expected" in html
    assert "degrade bound (baseline + 2σ) 1.35 x expected" in html


def test_timeline_api_returns_the_group_baseline(fleet, users):
    group, node, now = fleet["group"], fleet["nodes"][0], fleet["now"]
    store_baseline(group, [now - timedelta(minutes=m) for m in (50, 20, 5)], 1.1, peers=7)
    GroupBaseline.objects.create(group=group, signal="decode", at=now - timedelta(minutes=5), baseline=20.0)
    decides_on(group, "decode")
    body = viewer(users).get(f"/api/v1/nodes/{node.pk}/timeline/?hours=0.5&signal=norm").json()
    assert [(b["baseline"], b["peers"]) for b in body["baseline"]] == [(1.1, 7), (1.1, 7)]
    decode = viewer(users).get(f"/api/v1/nodes/{node.pk}/timeline/?hours=0.5&signal=decode").json()
    assert [b["baseline"] for b in decode["baseline"]] == [20.0]
    # By default the deciding signal: decode, once the group has a decode baseline (issue 26 item 2).
    default = viewer(users).get(f"/api/v1/nodes/{node.pk}/timeline/?hours=0.5").json()
    assert [b["baseline"] for b in default["baseline"]] == [20.0]


def test_preview_uses_the_stored_baseline_for_materiality(fleet):
    group, now = fleet["group"], fleet["now"]
    node = fleet["nodes"][5]
    NodeHistory.objects.filter(node=node).delete()
    write_history(node, start=now - timedelta(minutes=30), count=180, z=3.0, ema=1.8, state="degraded")
    ats = sorted(set(NodeHistory.objects.filter(node=node).values_list("at", flat=True)))

    def quarantines() -> list[str]:
        p = preview_thresholds(group, {"quarantine_z": 2.8}, now=now + timedelta(seconds=1))
        # The fleet's group needs approval: the replay's ejection layer holds the node pending, as the
        # detector would (the preview used to say "quarantined" whatever the policy).
        return [t.node for t in p.proposed if t.to_state in ("quarantined", "pending_approval")]

    # Median-EMA estimate ~1.04: EMA 1.8 >= 1.5 x 1.04, the new quarantine_z would quarantine it.
    assert node.name in quarantines()
    # The detector's recorded baseline was 1.3: 1.8 < 1.5 x 1.3 = 1.95, so it would not have.
    store_baseline(group, ats, 1.3)
    assert node.name not in quarantines()


def test_pages_show_the_signal_the_detector_decides_on(fleet, users):
    """Once the group logs TTFT the detector decides on decode: the group and node pages default to
    it (its Z, its baseline), and ``?signal=norm`` still shows the normalised total latency."""
    group, now = fleet["group"], fleet["now"]
    node = group.nodes.order_by("name").first()
    NodeHistory.objects.filter(node=node).delete()
    write_history(node, start=now - timedelta(seconds=30), count=3, z=0.6, ema=1.03)  # norm rows
    NodeHistory.objects.bulk_create([
        NodeHistory(node=node, signal="decode", at=now - timedelta(seconds=30 - 10 * i), ema=31.0, z=9.25,
                    samples=300 + i, weight=0.0, state="quarantined", evidence=11.5 + i, deciding=True)
        for i in range(3)
    ])
    GroupBaseline.objects.create(group=group, signal="decode", at=now, baseline=14.0, spread=0.7, peers=7)
    decides_on(group, "decode")
    c = viewer(users)
    page = c.get(f"/groups/{group.name}/").content.decode()
    assert "Signal: <strong>decode</strong>" in page
    assert "9.25" in page and "14.000 ± 0.700" in page
    norm = c.get(f"/groups/{group.name}/?signal=norm").content.decode()
    assert "Signal: <strong>norm</strong>" in norm and "9.25" not in norm
    node_page = c.get(f"/nodes/{node.pk}/").content.decode()
    assert "Decode time per token: EMA vs peer baseline" in node_page
    assert "Z-score vs peers (decode)" in node_page
    # The evidence chart reads the deciding signal's rows whichever signal is shown, with its cut line.
    for shown in (node_page, c.get(f"/nodes/{node.pk}/?signal=norm").content.decode()):
        assert "over 1.15x the baseline (CUSUM)" in shown
        assert "Latest: evidence 13.5 σ. Thresholds: weight cut 8" in shown


def test_a_young_node_page_starts_at_its_first_record(fleet, users):
    from django.utils import timezone

    group = fleet["group"]
    node = group.nodes.order_by("name").last()
    NodeHistory.objects.filter(node=node).delete()
    first = timezone.now() - timedelta(minutes=3)
    write_history(node, start=first, count=10, every_s=15)
    c = viewer(users)
    page = c.get(f"/nodes/{node.pk}/").content.decode()
    assert f"{first:%Y-%m-%d %H:%M} –" in page  # not an hour ago
    before = timezone.now() - timedelta(hours=1)
    hour = c.get(f"/nodes/{node.pk}/?hours=1").content.decode()
    after = timezone.now() - timedelta(hours=1)
    assert f"{before:%Y-%m-%d %H:%M} –" in hour or f"{after:%Y-%m-%d %H:%M} –" in hour  # asked for: an hour


def test_preview_replays_the_deciding_signal_and_its_recorded_evidence(fleet):
    """Once the group logs TTFT the preview replays the decode rows, and a weight cut needs the
    evidence recorded on them: lowering ``degrade_evidence`` below it shows the cut that would follow."""
    group, now = fleet["group"], fleet["now"]
    node = fleet["nodes"][6]
    ats = [now - timedelta(minutes=10) + timedelta(seconds=10 * i) for i in range(30)]
    GroupBaseline.objects.bulk_create([GroupBaseline(group=group, signal="decode", at=at, baseline=14.0,
                                                     spread=0.7, peers=7) for at in ats])
    # Decode 1.3x the baseline (Z 2.6), evidence 3 sd: over the Z and materiality lines, under 8.
    NodeHistory.objects.bulk_create([NodeHistory(node=node, signal="decode", at=at, ema=18.2, z=2.6, samples=100,
                                                 weight=100.0, state="healthy", evidence=3.0, deciding=True)
                                     for at in ats])
    decides_on(group, "decode")
    p = preview_thresholds(group, {"degrade_evidence": 2.5}, now=now + timedelta(seconds=1))
    assert p.signal == "decode" and p.to_dict()["signal"] == "decode"
    assert [t.rule for t in p.current if t.node == node.name] == []
    assert [(t.to_state, t.rule) for t in p.proposed if t.node == node.name] == [("degraded", "z_degrade")]
