"""Issue 35 on the first screen and the node page: a node's Since and Cause are its incident's, whatever
the canary did since, with its probes as one sub-line; an incident that ended without a fault found is
labelled so; the demo's injected faults are marked."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone

from outlier_admin.control.actions import audit
from outlier_admin.control.models import CanaryProbe, Transition
from outlier_admin.control.rows import TickRows, write_rows
from outlier_admin.fleet.models import Node


def _edges(group, node, start, edges):
    for k, (s, frm, to, reason, extra) in enumerate(edges):
        write_rows(group, 1000 + k, TickRows(transitions=[Transition(
            group=group, node=node, at=start + timedelta(seconds=s), from_state=frm, to_state=to, reason=reason,
            **extra)]))


def test_the_first_screen_tells_the_incident_once_and_labels_a_false_cut(fleet, users):
    group, nodes, now = fleet["group"], fleet["nodes"], timezone.now()
    slow, cut = nodes[5], nodes[6]
    start = now - timedelta(seconds=90)
    decode = {"signal": "decode", "z": 18.4, "ema": 30.87, "baseline": 16.07}
    _edges(group, slow, start, [(0, "healthy", "degraded", "z_degrade", decode),
                                (1, "degraded", "quarantined", "z_quarantine", decode)]
           + [(10 + 20 * k + d, a, b, r, {}) for k in range(3) for d, a, b, r in
              ((0, "quarantined", "probing", "probe_due"), (10, "probing", "quarantined", "probe_failed"))]
           + [(75, "quarantined", "probing", "probe_due", {})])
    for k in range(3):
        CanaryProbe.objects.create(node=slow, at=start + timedelta(seconds=20 + 20 * k), ok=True, status=200,
                                   normalised_latency=2.7, limit=1.4, passed=False, applied_at=now)
    Node.objects.filter(pk=slow.pk).update(state="probing", weight=0)
    _edges(group, cut, now - timedelta(minutes=10), [
        (0, "healthy", "degraded", "z_degrade", {"signal": "prefill_time", "z": 3.1, "ema": 1.71, "baseline": 0.93}),
        (53, "degraded", "healthy", "z_recovered", {"signal": "prefill_time"})])
    audit("demo.fault", "system:demo", node=slow, reason="injected by the demo",
          detail={"kind": "thermal_throttle", "starts_at": (start - timedelta(seconds=5)).timestamp(),
                  "ends_at": (now + timedelta(minutes=2)).timestamp()})

    c = Client()
    c.force_login(users["viewer"])
    html = c.get("/").content.decode()
    row = html.split(f">{slow.name}</a></th>")[1].split("</tr>")[0]
    assert f"{start:%Y-%m-%d %H:%M:%S}" in row  # Since: the incident's start, not the last probe's
    assert row.count("decode time per token") == 1 and "EMA 30.9 ms/token vs peer baseline 16.1 ms/token" in row
    assert "3 probes failed, last" in row and "2.70x expected, limit 1.40x expected" in row
    assert "canary probe is due" not in row and "demo: thermal throttle injected" in row
    assert 'id="injected-faults"' in html
    ended = html.split('id="ended-h"')[1].split("</section>")[0]
    assert f">{cut.name}</a>" in ended and "cut and restored: no fault found" in ended

    page = c.get(f"/nodes/{slow.pk}/").content.decode()
    assert page.index('id="incident-h"') < page.index('id="charts-h"')
    assert f"Incident since {start:%Y-%m-%d %H:%M:%S} UTC" in page
    folded = page.split('<details id="incident-probes">')[1].split("</details>")[0]
    assert folded.count('class="probe"') == 3 and folded.count('<td class="num limit">1.40</td>') == 3
    assert "7 canary cycle transitions" in folded  # three due + failed, and the last due


def test_a_fault_the_demo_healed_early_ends_at_its_heal(fleet):
    from outlier_admin.dashboard.firstscreen import injected_faults

    slow, now = fleet["nodes"][5], timezone.now()
    starts, ends, healed = now - timedelta(minutes=2), now + timedelta(minutes=2), now - timedelta(seconds=30)
    audit("demo.fault", "system:demo", node=slow, reason="injected by the demo",
          detail={"kind": "thermal_throttle", "starts_at": starts.timestamp(), "ends_at": ends.timestamp()})
    # Not this fault's heals: another kind's, and one from before it started (an earlier run's).
    for kind, at in (("pcie_downgrade", now - timedelta(minutes=1)), ("thermal_throttle", starts - timedelta(seconds=1))):
        audit("demo.heal", "system:demo", node=slow, reason="healed by the demo",
              detail={"kind": kind, "node": slow.name, "healed_at": at.timestamp()})
    [fault] = injected_faults()
    assert fault.ends_at.timestamp() == ends.timestamp()
    audit("demo.heal", "system:demo", node=slow, reason="healed by the demo (DEMO_HEAL_AFTER_PROBES)",
          detail={"kind": "thermal_throttle", "node": slow.name, "healed_at": healed.timestamp()})
    [fault] = injected_faults()
    assert fault.ends_at.timestamp() == healed.timestamp()
    assert fault.covers(healed - timedelta(seconds=1)) and not fault.covers(now)  # an incident after it is not the demo's
