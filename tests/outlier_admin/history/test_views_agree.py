"""The heatmap and the nodes table show the same Z for the same node and history write, on rows that
real ticks stored: the read model's rebuild of each write (history.replay.reading, the detector's
decide over the recorded state) picks the row the tick flagged as deciding, and its Z is the one the
nodes table and the API's node views read (history.queries.with_latest_figures)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from detector.signals import SIGNALS
from harness.records import make_records
from outlier_admin.control.tick import run_tick
from outlier_admin.dashboard.heatmap import cells, data_window
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.history import queries
from outlier_admin.history.replay import load, reading

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def _ticks(settings, make_group, count: int = 12) -> tuple[ModelGroup, float]:
    """A group of 8 nodes ticked ``count`` times, a history write at every tick; node 2 decodes 3x
    slower from the third tick (cut, then proposed for quarantine), node 5 1.3x (cut)."""
    from outlier_admin.ingest.pipeline import submit

    make_group("g1", policy="approval")
    settings.HISTORY_EVERY_S = 1
    rng = np.random.default_rng(5)
    t0 = time.time()
    for k in range(count):
        recs = make_records(t0 + k, rng=rng, slow={2: 3.0, 5: 1.3} if k >= 2 else {})
        submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
        run_tick("g1", now=t0 + k + 0.5)
    return ModelGroup.objects.get(name="g1"), t0


def test_the_rebuild_of_each_write_picks_the_row_the_tick_flagged(redis_client, settings, make_group):
    group, t0 = _ticks(settings, make_group)
    start, end = (datetime.fromtimestamp(t, tz=UTC) for t in (t0 - 1, t0 + 60))
    f = load(group.pk, start, end, SIGNALS)
    r = reading(f, group.thresholds())
    flagged = f.deciding >= 0
    assert flagged.sum() >= 8 * 8, "the ticks flagged the deciding row of most writes"
    assert (r.which[flagged] == f.deciding[flagged]).all()
    assert np.array_equal(r.z[flagged], f.z[f.deciding[flagged], np.flatnonzero(flagged)])
    states = {int(s) for s in f.state.tolist()}
    assert len(states) >= 2, "the window holds cut or proposed nodes as well as healthy ones"


def test_the_heatmap_and_the_nodes_table_show_the_same_z(redis_client, settings, make_group):
    group, t0 = _ticks(settings, make_group)
    now = datetime.fromtimestamp(t0 + 12, tz=UTC)
    window = data_window(now, datetime.fromtimestamp(t0, tz=UTC), 1)
    assert window.step_s == 1 and window.buckets <= 15  # one write per cell
    table = queries.group_nodes(group, "name", signal=None)  # the dashboard's default: deciding signals
    grid = cells(table, window, group.thresholds())
    compared = 0
    for n in table:
        last = next((c for c in reversed(grid[n.pk]) if c.state is not None), None)
        assert last is not None, n.name
        if n.latest_z is None:
            assert last.z is None, (n.name, last)
            continue
        assert last.z is not None and math.isclose(last.z, n.latest_z, rel_tol=0, abs_tol=1e-12), (n.name, last, n.latest_z)
        assert last.signal == n.latest_signal and last.readings == 1
        compared += 1
    assert compared >= 6
    # The API's node view reads the same figures.
    api = {n.name: (n.latest_signal, n.latest_z) for n in queries.with_latest_figures(group.nodes.all())}
    assert api == {n.name: (n.latest_signal, n.latest_z) for n in table}
    assert window.end - window.start <= timedelta(seconds=20)

