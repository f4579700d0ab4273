"""Issue 35's acceptance, in real headless Chromium over the demo (``python -m outlier_admin.demo``, its
faults at +3 s, its canary every 2 s, healed after 4 failed probes): through three canary cycles of the
throttled h100-05 the first screen's Since stays at the incident's start and its Cause names the
deciding signal, with its latest probe beneath; ``outlier_transitions_total{to_state="quarantined"}``
reads 1 for the incident; every probe row of the node page shows its limit; once the fault heals, the
node passes its probes.

Screenshots (1400x900) go to ``reports/screenshots`` (``ISSUE35_SHOTS=<dir>`` for the docs' copies)."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from detector.signals import SIGNAL_NAMES
from tests.browser.conftest import SHOTS, chromium_page
from tests.browser.demo_run import LARGE, THROTTLED, log_in, running_demo, screenshots

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200)]

#: A quarantined node's first probe waits the canary interval, and so does each probe after a failed
#: one: at the groups' 10 s the third failed probe starts 30 s after the quarantine, at 2 s, 6 s after.
CANARY_INTERVAL_S = 2
#: The faults heal once h100-05 has failed this many probes, one more than the test reads the first
#: screen at: the first probe that can pass comes a cycle after that read, at the machine's pace. (A
#: heal at a fixed +150 s was the room for three 10 s cycles and the checks on a busy machine.)
HEAL_AFTER_PROBES = 4
HEAL_AT_S = 900  # no later than that, whatever the probes did (the waits below fail well before)


def _failed_probes(demo) -> int:
    return demo.query("SELECT count(*) FROM control_canaryprobe p JOIN fleet_node n ON n.id = p.node_id "
                      "WHERE n.name = ? AND p.passed = 0", THROTTLED)[0][0]


def _incident(demo) -> tuple | None:
    rows = demo.query("SELECT i.id, i.started_at, i.signal, i.unit, i.ended_at FROM control_incident i "
                      "JOIN fleet_node n ON n.id = i.node_id WHERE n.name = ? ORDER BY i.started_at", THROTTLED)
    return rows[0] if rows else None


def _healed_at(demo) -> float | None:
    """When the demo healed its faults (epoch s): its audit events ``demo.heal``."""
    rows = demo.query("SELECT detail FROM control_auditevent WHERE action = 'demo.heal'")
    return min(json.loads(d)["healed_at"] for d, in rows) if rows else None


def _quarantines(demo) -> float | None:
    text = httpx.get(demo.url + "/metrics", timeout=10).text
    series = f'outlier_transitions_total{{group="{LARGE}",to_state="quarantined"}} '
    m = re.search("^" + re.escape(series) + r"(\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_one_incident_through_three_probe_cycles_and_a_healed_node_passes(tmp_path, settings, redis_client):
    # redis_client: an empty Redis database (the event scan's cursors of an earlier run would skip this one's rows)
    shots = Path(os.environ.get("ISSUE35_SHOTS") or SHOTS)
    with running_demo(tmp_path, settings.REDIS_URL, DEMO_FAULT_AT_S="3", DEMO_PCIE_AT_S="3",
                      DEMO_HEAL_AT_S=str(HEAL_AT_S), DEMO_HEAL_AFTER_PROBES=str(HEAL_AFTER_PROBES),
                      DEMO_TICK_S="0.5", DEMO_CANARY_INTERVAL_S=str(CANARY_INTERVAL_S)) as demo, chromium_page() as page:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.set_default_timeout(60_000)  # the demo shares the machine with its 40 simulated nodes
        demo.wait_for("h100-05's incident", lambda: _incident(demo), 240)
        log_in(page, demo)
        assert page.locator("#injected-faults").is_visible()  # the demo marks its own faults
        assert THROTTLED in page.locator("#injected-faults").inner_text()
        seen: list[tuple[str, str, str]] = []
        for cycle in (1, 2, 3):
            demo.wait_for(f"failed probe {cycle}", lambda c=cycle: _failed_probes(demo) >= c, 240)
            page.goto(demo.url + "/")
            row = page.locator("#attention tbody tr", has_text=THROTTLED)
            cells = row.locator("td")
            seen.append((cells.nth(2).inner_text(), cells.nth(4).inner_text(), row.locator("small.probes").inner_text()))
        _, started, signal, unit, ended = _incident(demo)
        start = datetime.fromisoformat(started).replace(tzinfo=UTC) if isinstance(started, str) else started
        since = f"{start:%Y-%m-%d %H:%M:%S}"
        assert [s for s, _, _ in seen] == [since] * 3, seen  # Since: the incident's start, every cycle
        for _, cause, probes in seen:
            assert SIGNAL_NAMES[signal] in cause and unit in cause, cause  # the deciding signal, with units
            assert re.search(r"\d+ probes? failed, last \d+ s ago: [\d.]+x expected, limit [\d.]+x expected", probes), probes
        assert int(seen[-1][2].split()[0]) >= 3
        assert ended is None

        # The quarantine counter counts the incident once (the event scan runs every 2 s).
        demo.wait_for("the event scan", lambda: _quarantines(demo) is not None, 30)
        assert _quarantines(demo) == 1.0

        # The node page opens on the incident; every judged probe row shows its limit.
        page.goto(f"{demo.url}/nodes/{demo.node_pk(THROTTLED)}/")
        heading = page.locator("#incident-h")
        assert heading.inner_text().startswith(f"Incident since {since}")
        assert heading.bounding_box()["y"] < page.locator("#charts-h").bounding_box()["y"]
        assert not page.locator("#incident-probes table").is_visible()  # folded
        page.locator("#incident-probes summary").click()
        rows = page.locator("#incident-probes tr.probe")
        assert rows.count() >= 3
        for k in range(rows.count()):
            limit = rows.nth(k).locator("td.limit").inner_text()
            assert re.fullmatch(r"\d+\.\d\d", limit), (k, limit)
            assert float(limit) >= 1.0  # never below what a healthy peer answers
        screenshots(page, demo, shots, "after")

        # Healed: the node passes its probes at the peers' load.
        healed_at = demo.wait_for(f"the heal after {HEAL_AFTER_PROBES} failed probes", lambda: _healed_at(demo), 240)
        demo.wait_for("a passed probe after the heal", lambda: demo.query(
            "SELECT count(*) FROM control_canaryprobe p JOIN fleet_node n ON n.id = p.node_id "
            "WHERE n.name = ? AND p.passed = 1 AND p.at > ?", THROTTLED,
            datetime.fromtimestamp(healed_at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f"))[0][0] >= 1, 300)
        page.goto(f"{demo.url}/nodes/{demo.node_pk(THROTTLED)}/")
        page.locator("#incident-probes summary").click()
        first = page.locator("#incident-probes tr.probe").first
        assert "✔ pass" in first.inner_text() and float(first.locator("td.limit").inner_text()) >= 1.0
        assert _quarantines(demo) == 1.0
        page.screenshot(path=str(shots / "after-node-healed.png"), full_page=True)
        page.goto("about:blank")
        time.sleep(0.2)
