"""The group page's heatmap colours a node by where the detector puts it against its peers: Z over
the degrade line *and* materially slower (EMA over ``degrade_materiality`` times the peers'
baseline), on its deciding signal; a healthy fleet whose prefill times spread by a few percent is
not painted as outliers. The Z of every row is the detector's own (:func:`detector.baseline.robust_zscores`
over the EMAs written), the baseline the one it stores."""

from __future__ import annotations

import re
from datetime import timedelta

import numpy as np
import pytest
from django.test import Client
from django.utils import timezone

from detector.baseline import robust_zscores
from detector.thresholds import Thresholds
from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.dashboard.heatmap import cell_color, heatmap_legend

pytestmark = pytest.mark.django_db

#: Prefill time per node (x the cost model's expectation) of a healthy group: a spread of 15%, whose
#: slowest node is 1.11x the median, under the 1.15x materiality line, but at Z 2.3 (the spread is at
#: its floor, 5% of the baseline).
HEALTHY_PREFILL = [0.97, 0.99, 1.00, 1.00, 1.01, 1.02, 1.05, 1.12]
#: Decode time per output token (ms), all within 4% of one another.
HEALTHY_DECODE = [55.0, 56.0, 56.5, 57.0, 57.0, 57.5, 58.0, 59.0]


def write_group(prefill: list[float], decode: list[float], *, minutes: int = 10):
    """A group of 8 nodes with ``minutes`` of history every 10 s on decode and prefill_time (Z, EMA
    and the stored baseline as the tick writes them)."""
    group = do_create_group("heat", actor="setup")
    nodes = [do_register_node(group, f"127.0.0.{i + 1}:8000", actor="setup", name=f"node-{i}") for i in range(8)]
    now = timezone.now()
    t = Thresholds()
    rows, bases = [], []
    everyone = np.ones(8, dtype=bool)
    zs = {}
    for signal, emas in (("prefill_time", prefill), ("decode", decode)):
        ema = np.array(emas)
        pb = robust_zscores(ema, everyone, everyone, min_peers=t.min_peers, spread_floor=t.spread_floor)
        zs[signal] = pb.z
        for k in range(minutes * 6):
            at = now - timedelta(seconds=10 * (minutes * 6 - k))
            bases.append(GroupBaseline(group=group, signal=signal, at=at, baseline=pb.baseline, spread=pb.spread,
                                       peers=pb.peers))
            rows += [NodeHistory(node=n, signal=signal, at=at, ema=float(ema[i]), z=float(pb.z[i]), samples=500,
                                 weight=100.0, state="healthy") for i, n in enumerate(nodes)]
    NodeHistory.objects.bulk_create(rows)
    GroupBaseline.objects.bulk_create(bases)
    return group, nodes, zs


def heat_cells(client: Client, group, query: str = "") -> dict[str, list[str]]:
    """``{node name: [class of each cell]}`` of the rendered heatmap."""
    html = client.get(f"/groups/{group.slug}/?partial=heatmap{query}").content.decode()
    out = {}
    for row in re.findall(r'<g class="heat-row".*?</g>', html, re.S):
        name = re.search(r"<title>([^<]+)</title>", row).group(1)
        out[name] = re.findall(r'<rect class="cell ([a-z-]+)"', row)
    return out


@pytest.fixture
def viewer(users) -> Client:
    c = Client()
    c.force_login(users["viewer"])
    return c


def test_a_healthy_spread_of_prefill_times_paints_no_cell_over_the_line(viewer):
    group, _, zs = write_group(HEALTHY_PREFILL, HEALTHY_DECODE)
    t = Thresholds()
    # Raw Z alone puts the slowest node over the degrade line (the old heatmap's orange).
    assert zs["prefill_time"][7] >= t.degrade_z
    for query in ("", "&signal=prefill_time"):
        cells = heat_cells(viewer, group, query)
        # The axis spans the data: 10 minutes of history every 10 s in cells of 10 or 15 s, none empty.
        assert len(cells) == 8 and all(40 <= len(c) <= 60 for c in cells.values()), {len(c) for c in cells.values()}
        kinds = {k for c in cells.values() for k in c}
        assert kinds <= {"z-under", "z-slower"}, (query, kinds)
        assert set(cells["node-7"]) == {"z-slower"}
    html = viewer.get(f"/groups/{group.slug}/?signal=prefill_time").content.decode()
    assert "node-7" in html and "1.11× the peers&#x27; baseline" in html and "σ on prefill_time" in html


def test_a_node_materially_slower_on_its_deciding_signal_is_painted_over_the_line(viewer):
    prefill = [*HEALTHY_PREFILL[:7], 1.60]  # node 7: 1.59x its peers' prefill time (its line: 1.5x)
    decode = [*HEALTHY_DECODE[:6], 90.0, HEALTHY_DECODE[7]]  # node 6: 1.58x its peers' decode time
    group, nodes, _ = write_group(prefill, decode)
    cells = heat_cells(viewer, group)
    assert set(cells["node-7"]) == {"z-degrade"}  # prefill time cuts, never quarantines on its own
    assert set(cells["node-6"]) == {"z-quarantine"}  # decode at Z >= 3.5 and >= 1.5x: quarantine strength
    assert {k for name, c in cells.items() if name not in ("node-6", "node-7") for k in c} <= {"z-under", "z-slower"}
    # One signal at a time: on decode, node 7 is a healthy node.
    on_decode = heat_cells(viewer, group, "&signal=decode")
    assert set(on_decode["node-7"]) <= {"z-under", "z-slower"} and set(on_decode["node-6"]) == {"z-quarantine"}
    html = viewer.get(f"/groups/{group.slug}/").content.decode()
    assert "on its <strong>deciding signal</strong> (the larger Z of decode and prefill_time" in html
    row = re.search(rf'<g class="heat-row" data-node="{nodes[6].pk}">.*?</g>', html, re.S).group(0)
    assert "σ on decode, 1.58× the peers&#x27; baseline: at quarantine strength" in row


def test_a_prefill_time_under_its_own_line_is_shown_under_the_line_with_its_z(viewer):
    """The detector sets a node's prefill time aside under prefill_materiality (decode speaks for it):
    on the prefill_time view the cell still shows its Z, as slower but under the line."""
    prefill = [*HEALTHY_PREFILL[:7], 1.30]  # node 7: 1.29x, Z 5.7: over degrade_z, under 1.5x
    group, _, zs = write_group(prefill, HEALTHY_DECODE)
    assert zs["prefill_time"][7] > Thresholds().quarantine_z
    cells = heat_cells(viewer, group, "&signal=prefill_time")
    assert set(cells["node-7"]) == {"z-slower"} and "no-z" not in {k for c in cells.values() for k in c}
    html = viewer.get(f"/groups/{group.slug}/?partial=heatmap&signal=prefill_time").content.decode()
    assert "σ on prefill_time, 1.29× the peers&#x27; baseline: slower than its peers, under the degrade line" in html


def test_the_legend_says_what_each_colour_means_with_units():
    t = Thresholds()
    legend = {css: meaning for css, _, meaning in heatmap_legend(t)}
    assert legend["z-degrade"].startswith(
        "over the degrade line (Z ≥ 2 σ and EMA ≥ 1.15× the peers' baseline (1.5× on prefill_time))")
    assert "Z ≥ 3.5 σ and EMA ≥ 1.5× the peers' baseline, not on prefill_time alone" in legend["z-quarantine"]
    # However high an immaterial Z is, its cell stays the pale yellow of "under the line".
    assert cell_color(1, 50.0, t) == cell_color(1, t.degrade_z, t) == "#fff0a8"
    assert cell_color(2, t.degrade_z, t) == "#ef8f00" and cell_color(3, 4.0, t) == "#c62828"
    seed = {css: meaning for css, _, meaning in heatmap_legend(Thresholds(baseline_mode="seed"))}
    assert "×" not in seed["z-degrade"]  # seed mode has no materiality line


def test_the_orm_read_of_other_databases_gives_the_rows_of_the_postgresql_read(monkeypatch):
    """The demo's SQLite reads the history through the ORM; PostgreSQL by plain SQL (epoch seconds)."""
    from types import SimpleNamespace

    from outlier_admin.history import replay

    group, nodes, _ = write_group(HEALTHY_PREFILL, HEALTHY_DECODE, minutes=2)
    end = timezone.now() + timedelta(seconds=1)
    window = (("decode", "prefill_time"), end - timedelta(minutes=5), end, None)
    sql = sorted(replay._rows(group.pk, None, *window))
    by_node = sorted(replay._rows(group.pk, [n.pk for n in nodes], *window))
    monkeypatch.setattr(replay, "connection", SimpleNamespace(vendor="sqlite"))
    orm = sorted(replay._rows(group.pk, None, *window))
    assert len(sql) == 8 * 12 * 2 and sql == orm == by_node


def test_the_time_axis_spans_the_data():
    """Three minutes of history fill the axis (the old one put them in the right 5 % of an hour);
    an hour or more of it is the last hour in one-minute cells."""
    from datetime import UTC, datetime

    from outlier_admin.dashboard.heatmap import data_window

    now = datetime(2026, 1, 1, 12, 0, 3, tzinfo=UTC)
    w = data_window(now, now - timedelta(minutes=3), 10)
    assert (w.step_s, w.buckets) == (10.0, 19) and w.start <= now - timedelta(minutes=3) < w.start + timedelta(seconds=10)
    assert w.end >= now
    hour = data_window(now, now - timedelta(hours=5), 10)
    assert (hour.step_s, hour.buckets) == (60.0, 60)
    assert data_window(now, None, 10).buckets == 60  # no data: the last 60 history steps
