"""The first screen (every node that is not healthy, first, with what the gateways applied), the
group page's heatmap and problem-first sorting, the node page's probe Z and state bands, and styled
404/500 pages."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.template import loader
from django.test import Client

from agent.client import GatewayClient
from detector.thresholds import Thresholds
from outlier_admin.control.models import CanaryProbe, NodeHistory, Transition
from outlier_admin.dashboard.charts import probe_z
from outlier_admin.dashboard.svg import Threshold, time_chart
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.history.timeline import BaselinePoint

pytestmark = pytest.mark.django_db


def viewer(users) -> Client:
    c = Client()
    c.force_login(users["viewer"])
    return c


@pytest.fixture
def incident(fleet, redis_client):
    """On top of ``fleet``: node 1 waiting for approval, node 2 degraded, node 3 probing (no Z: it
    gets no traffic); two gateways, one two versions behind."""
    group, nodes, now = fleet["group"], fleet["nodes"], fleet["now"]
    Node.objects.filter(pk=nodes[1].pk).update(state="pending_approval", weight=5)
    Node.objects.filter(pk=nodes[2].pk).update(state="degraded", weight=35)
    Node.objects.filter(pk=nodes[3].pk).update(state="probing", weight=0)
    NodeHistory.objects.filter(node=nodes[3]).delete()
    Transition.objects.create(group=group, node=nodes[2], at=now - timedelta(minutes=3), from_state="healthy",
                              to_state="degraded", reason="z_degrade", signal="norm", z=2.6,
                              explanation={"detail": "Z 2.6 >= degrade_z 2.0"})
    ModelGroup.objects.filter(pk=group.pk).update(weights_version=12)
    client = GatewayClient(redis_client, group.name)
    client.report_applied("gw-a/haproxy", 12, time.time(), "live")
    client.report_applied("gw-b/nginx", 10, time.time() - 30, "live")
    return fleet


def attention_rows(html: str) -> list[str]:
    table = html.split('id="attention"')[1].split("</table>")[0]
    return re.findall(r'<tr class="row-([a-z_]+)">\s*<th scope="row"><a [^>]*href="/nodes/\d+/">([^<]+)</a>', table)


def test_the_first_screen_lists_every_unhealthy_node_first_with_its_evidence(incident, users):
    nodes = incident["nodes"]
    html = viewer(users).get("/").content.decode()
    assert html.index('id="attention"') < html.index('id="groups"') < html.index('id="recent"')
    assert attention_rows(html) == [("pending_approval", nodes[1].name), ("quarantined", nodes[0].name),
                                    ("degraded", nodes[2].name), ("probing", nodes[3].name)]
    row = html.split(f">{nodes[0].name}</a></th>")[1].split("</tr>")[0]
    quarantined_at = Transition.objects.get(node=nodes[0], to_state="quarantined").at
    assert quarantined_at.strftime("%Y-%m-%d %H:%M:%S") in row
    assert "much slower than its peers" in row and "Z 4.2 &gt;= quarantine_z 3.5 for 10 samples" in row
    assert "0/100" in row and "v10 on the oldest of 2 gateway(s); published v12 (1 gateway(s) behind)" in row
    assert "waiting for approval" in html.split(f">{nodes[1].name}</a></th>")[1].split("</tr>")[0]
    assert "gw-b/nginx: v10 <strong>(2 versions behind)</strong>" in html and "gw-a/haproxy: v12," in html
    for healthy in nodes[4:]:
        assert f">{healthy.name}</a></th>" not in html.split('id="attention"')[1].split("</table>")[0]


def test_a_healthy_fleet_says_so(fleet, users, redis_client):
    Node.objects.update(state="healthy", weight=100)
    html = viewer(users).get("/").content.decode()
    assert 'id="attention"' not in html and "All 8 live nodes are healthy" in html
    assert "no gateway has reported (published v0)" in html


def test_the_group_table_puts_problems_and_nodes_without_a_z_first(incident, users):
    c, nodes, g = viewer(users), incident["nodes"], incident["group"]
    by_attention = c.get(f"/groups/{g.slug}/?partial=nodes").content.decode()
    order = re.findall(r'<tr class="row-([a-z_]+)">', by_attention)
    assert order[:4] == ["pending_approval", "quarantined", "degraded", "probing"] and set(order[4:]) == {"healthy"}
    by_z = c.get(f"/groups/{g.slug}/?partial=nodes&sort=-z").content.decode()
    names = re.findall(r'<th scope="row"><a href="/nodes/\d+/">([^<]+)</a>', by_z)
    assert names[0] == nodes[3].name  # probing: no Z, first
    assert names[1] == nodes[0].name  # then the highest real Z (4.2)
    assert "EMA (x expected)" in by_z


def test_the_group_heatmap_shows_z_and_state_bands(incident, users):
    c, nodes, g = viewer(users), incident["nodes"], incident["group"]
    html = c.get(f"/groups/{g.slug}/").content.decode()
    svg = html.split('<svg class="heatmap"')[1].split("</svg>")[0]
    rows = re.findall(r'<g class="heat-row" data-node="(\d+)">', svg)
    assert len(rows) == 8 and rows[:4] == [str(nodes[i].pk) for i in (1, 0, 2, 3)]
    q_row = svg.split(f'data-node="{nodes[0].pk}">')[1].split("</g>")[0]
    # Z 4.2 >= quarantine_z at 1.9x its peers' EMA (no stored baseline: their median): red.
    assert 'class="cell z-quarantine"' in q_row and 'fill="#c62828"' in q_row
    assert "Z 4.20 σ on norm, 1.9" in q_row and "at quarantine strength" in q_row and ", quarantined</title>" in q_row
    assert 'class="band band-quarantined"' in q_row and 'class="band band-healthy"' in q_row
    probing_row = svg.split(f'data-node="{nodes[3].pk}">')[1].split("</g>")[0]
    assert 'class="cell"' not in probing_row  # no history: no cells, nothing invented
    partial = c.get(f"/groups/{g.slug}/?partial=heatmap").content.decode()
    assert "<html" not in partial and partial.count('class="heat-row"') == 8


def test_probe_results_are_read_as_z_against_the_norm_baseline():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    baseline = [BaselinePoint(t0, 1.0, 0.1, 8), BaselinePoint(t0 + timedelta(minutes=5), 1.2, 0.2, 8)]
    probes = [CanaryProbe(at=t0 + timedelta(minutes=1), ok=True, normalised_latency=1.5),
              CanaryProbe(at=t0 + timedelta(minutes=6), ok=True, normalised_latency=1.3),
              CanaryProbe(at=t0 + timedelta(minutes=7), ok=False, normalised_latency=None)]
    assert [(at, round(z, 6)) for at, z in probe_z(probes, baseline)] == [
        (t0 + timedelta(minutes=1), 5.0), (t0 + timedelta(minutes=6), 0.5)]


def test_the_node_page_draws_probes_as_z_and_states_as_bands(incident, users):
    n0, now = incident["nodes"][0], incident["now"]
    from outlier_admin.control.models import GroupBaseline

    GroupBaseline.objects.create(group=incident["group"], signal="norm", at=now - timedelta(minutes=20),
                                 baseline=1.0, spread=0.1, peers=7)
    for k in range(20):
        CanaryProbe.objects.create(node=n0, at=now - timedelta(seconds=30 * k + 5), ok=True, normalised_latency=1.6)
    html = viewer(users).get(f"/nodes/{n0.pk}/").content.decode()
    z = html.split('id="z-chart">')[1].split("</svg>")[0]
    assert z.count("<circle") >= 20 and "canary probe (Z vs norm baseline)" in z
    assert 'class="marker"' not in z and z.count('class="band"') == 2  # degraded, then quarantined: 2 spans
    assert 'viewBox="0 0 1200 ' in z


def test_threshold_labels_never_overlap():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    svg = time_chart([], title="Z", unit="σ", start=t0, end=t0 + timedelta(hours=1),
                     thresholds=[Threshold("degrade Z", 3.4), Threshold("quarantine Z", 3.5)])
    ys = sorted(float(y) for y in re.findall(r'class="threshold-label" x="[\d.]+" y="([\d.]+)"', svg))
    assert len(ys) == 2 and ys[1] - ys[0] >= 12


def test_404_and_500_pages_are_styled_with_the_navigation(users):
    resp = viewer(users).get("/no-such-page/")
    body = resp.content.decode()
    assert resp.status_code == 404 and "<h1>Not found</h1>" in body and 'href="/audit/"' in body
    assert "/static/dashboard/dashboard.css" in body and "/no-such-page/" in body
    api = viewer(users).get("/api/v1/no-such-thing/")
    assert api.status_code == 404 and "json" in api["Content-Type"]  # the API keeps its own JSON 404
    # Django renders 500.html without a request context (the error may be in a context processor).
    error = loader.get_template("500.html").render()
    assert "Something went wrong" in error and 'href="/audit/"' in error and "dashboard.css" in error


def test_a_thresholds_object_is_what_the_heatmap_colours_by():
    from outlier_admin.dashboard.heatmap import AT_OR_UNDER, OVER_DEGRADE, OVER_QUARANTINE, SLOWER, cell_color

    t = Thresholds()
    assert cell_color(AT_OR_UNDER, -1.0, t) == "#ffffff" and cell_color(OVER_QUARANTINE, t.quarantine_z, t) == "#c62828"
    assert cell_color(SLOWER, t.degrade_z, t) == "#fff0a8" and cell_color(OVER_DEGRADE, t.degrade_z, t) == "#ef8f00"
    assert cell_color(OVER_DEGRADE, t.quarantine_z, t) == "#bf360c"


def overrides_table(html: str) -> list[list[str]]:
    table = html.split('id="overrides"')[1].split("</table>")[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip()
            for row in re.findall(r'<tr class="override-[a-z_]+">(.*?)</tr>', table, re.S)]


def test_the_first_screen_lists_every_override_in_force_with_who_why_and_until(fleet, users, redis_client):
    """A pin on a node the detector calls healthy, a forced state and a silence are on the first
    screen with who, why and until when; an expired pin, an undone pin and a refused one are not."""
    from outlier_admin.control.actions import (
        do_activate,
        do_pin_weight,
        do_quarantine,
        do_reject_proposal,
        do_unpin_weight,
    )
    from outlier_admin.control.models import Outcome, Override

    nodes = fleet["nodes"]
    do_pin_weight(nodes[2], 50, actor="alice", reason="suspect fan, halve its share", expires_in_s=300)
    old = do_pin_weight(nodes[3], 10, actor="bob", reason="old pin", expires_in_s=60)
    Override.objects.filter(pk=old.pk).update(expires_at=fleet["now"] - timedelta(seconds=1))
    do_pin_weight(nodes[4], 20, actor="bob", reason="pinned then unpinned")
    do_unpin_weight(nodes[4], actor="bob", reason="done")
    refused = do_pin_weight(nodes[5], 30, actor="bob", reason="the tick refused it")
    Override.objects.filter(pk=refused.pk).update(outcome=Outcome.FAILED, outcome_reason="node gone")
    do_quarantine(nodes[6], actor="carol", reason="fan replacement, ticket 4711", expires_in_s=3600)
    Node.objects.filter(pk=nodes[6].pk).update(state="forced_quarantine", weight=0)
    do_activate(nodes[7], actor="dave", reason="keep it in during the migration")  # the tick has not applied it
    do_reject_proposal(fleet["proposal"], actor="erin", reason="known noisy neighbour", silence_s=1800)

    html = viewer(users).get("/").content.decode()
    rows = overrides_table(html)
    assert len(rows) == 3, rows
    silence, forced, pin = rows  # newest first
    assert nodes[1].name in silence and "no new latency outlier" in silence and "erin" in silence
    assert "known noisy neighbour" in silence
    assert forced.startswith(nodes[6].name) and "forced out of service" in forced and "carol" in forced
    assert "fan replacement, ticket 4711" in forced and "in 59 minutes" in forced
    assert pin.startswith(nodes[2].name) and "weight pinned at 50/100" in pin and "alice" in pin
    assert "suspect fan, halve its share" in pin and "in 4 minutes" in pin
    # The forced node's row in "needs attention" says who, why and until when.
    row = html.split(f'href="/nodes/{nodes[6].pk}/">{nodes[6].name}</a></th>')[1].split("</tr>")[0]
    assert "forced out of service by carol" in row and "fan replacement, ticket 4711 (until 20" in row


def test_no_override_in_force_says_so(fleet, users, redis_client):
    html = viewer(users).get("/").content.decode()
    assert "Operator overrides in force (0)" in html and "None: every node follows the detector." in html


def test_a_node_held_degraded_past_degraded_alert_s_says_needs_hardware_check(incident, users):
    """Issue 25: the first screen says which cut node needs a hardware check: held degraded longer than
    its group's ``degraded_alert_s`` (the ``OutlierNodeHardwareCheck`` alert's rule). Node 2 was cut 3
    minutes ago: not yet; after 11 minutes, yes; the node waiting for approval never (its proposal is
    the signal)."""
    group, nodes, now = incident["group"], incident["nodes"], incident["now"]
    client = viewer(users)
    assert "needs hardware check" not in client.get("/").content.decode()
    Transition.objects.filter(node=nodes[2], to_state="degraded").update(at=now - timedelta(minutes=11))
    html = client.get("/").content.decode()
    row = html.split(f">{nodes[2].name}</a>")[1].split("</tr>")[0]
    assert "needs hardware check: held degraded for 11" in row
    assert html.count("needs hardware check") == 1
    ModelGroup.objects.filter(pk=group.pk).update(threshold_overrides={"degraded_alert_s": 3600})
    assert "needs hardware check" not in client.get("/").content.decode()


def test_a_gateway_that_stopped_reporting_shows_as_gone_not_behind(incident, users, redis_client, settings):
    """An agent run once (--once) reported v2 and stopped: after GATEWAY_GONE_AFTER_S it no longer
    counts as behind (it said "10 versions behind" for good), and shows as gone."""
    group = incident["group"]
    settings.GATEWAY_GONE_AFTER_S = 300
    GatewayClient(redis_client, group.name).report_applied("gw-once/haproxy", 2, time.time() - 301, "live")
    html = viewer(users).get("/").content.decode()
    assert "gw-once/haproxy: gone (last report" in html and "10 versions behind" not in html
    assert "v10 on the oldest of 2 gateway(s); published v12 (1 gateway(s) behind); 1 gone (no report for 300 s)" in html
    # Reporting again, it is back, and behind.
    GatewayClient(redis_client, group.name).report_applied("gw-once/haproxy", 2, time.time(), "live")
    html = viewer(users).get("/").content.decode()
    assert "gw-once/haproxy: v2 <strong>(10 versions behind)</strong>" in html
