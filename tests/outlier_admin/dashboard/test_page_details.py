"""Small things an operator reads on every page: how long ago (never "0 minutes"), and no 404 for the
browser's favicon request logged on every page view."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from outlier_admin.dashboard.templatetags.dashboard_text import elapsed
from outlier_admin.fleet.models import Node

pytestmark = pytest.mark.django_db


def test_elapsed_counts_seconds_under_a_minute_and_words_after():
    now = timezone.now()
    assert elapsed(now - timedelta(seconds=40)) == "40 s"
    assert elapsed(now + timedelta(seconds=5)) == "0 s"  # a clock a little ahead is not negative
    assert elapsed(now - timedelta(minutes=5, seconds=3)) == "5\xa0minutes"
    assert elapsed(None) == "–"


def test_a_node_cut_seconds_ago_reads_in_seconds_on_the_first_screen(fleet, users):
    from outlier_admin.control.models import Transition

    node = fleet["nodes"][2]
    Node.objects.filter(pk=node.pk).update(state="degraded", weight=40)
    Transition.objects.create(group=fleet["group"], node=node, at=timezone.now() - timedelta(seconds=12),
                              from_state="healthy", to_state="degraded", reason="z_degrade", signal="decode",
                              z=2.5, explanation={})
    c = Client()
    c.force_login(users["viewer"])
    row = c.get("/").content.decode().split(f">{node.name}</a></th>")[1].split("</tr>")[0]
    assert "0\xa0minutes" not in row and " s</td>" in row


def test_the_favicon_is_served_and_not_a_404(client, users):
    resp = client.get("/favicon.ico")
    assert resp.status_code == 301 and resp["Location"].endswith("dashboard/favicon.svg")
    c = Client()
    c.force_login(users["viewer"])
    assert 'rel="icon" type="image/svg+xml"' in c.get("/").content.decode()
    assert c.get(resp["Location"]).status_code == 200


def test_threshold_fields_name_their_unit_and_no_two_read_alike():
    from detector.thresholds import Thresholds
    from outlier_admin.dashboard.forms import ThresholdForm

    form = ThresholdForm(current=Thresholds())
    labels = [f.label for name, f in form.fields.items() if name != "reason"]
    assert len(labels) == len(set(labels)), labels
    assert form.fields["quarantine_persistence_s"].label == "quarantine persistence (seconds)"
    assert "samples" in form.fields["quarantine_persistence"].label


def test_the_canary_review_keeps_a_recovered_nodes_probes_and_steps(fleet, users):
    """Read after the fact ("why did it come back?"): a node recovered an hour ago still shows its
    probes and restore steps; one recovered two days ago does not."""
    from outlier_admin.control.models import CanaryProbe, Transition

    group, nodes, now = fleet["group"], fleet["nodes"], timezone.now()
    back, old = nodes[2], nodes[3]
    for node, when in ((back, now - timedelta(hours=1)), (old, now - timedelta(days=2))):
        CanaryProbe.objects.create(node=node, at=when - timedelta(seconds=30), ok=True, status=200, total_ms=118.0,
                                   prompt_tokens=8, completion_tokens=16)
        for frm, to, reason in (("probing", "recovering", "probes_passed"), ("recovering", "healthy", "recovered")):
            Transition.objects.create(group=group, node=node, at=when, from_state=frm, to_state=to, reason=reason,
                                      signal="", explanation={"detail": f"{reason} detail"})
    c = Client()
    c.force_login(users["viewer"])
    html = c.get("/canary/").content.decode()
    recovered = html.split('id="recovered-h"')[1]
    assert f">{back.name}</a>" in recovered and "recovered detail" in recovered and "probes_passed" in recovered
    assert "118" in recovered  # its probe
    assert f">{old.name}</a>" not in html
    assert f">{nodes[0].name}</a>" in html.split('id="recovered-h"')[0]  # quarantined now: the live list


def test_a_cause_names_its_signal_and_the_evidence_its_units(fleet, users):
    """Issue 26 item 4: the cause never named the deciding signal, and ``EMA=1.355 baseline=1.003``
    sat next to ms per token without a unit."""
    from outlier_admin.control.models import Transition

    group, node, now = fleet["group"], fleet["nodes"][4], timezone.now()
    Node.objects.filter(pk=node.pk).update(state="degraded", weight=30)
    Transition.objects.create(group=group, node=node, at=now - timedelta(seconds=3), from_state="healthy",
                              to_state="degraded", reason="z_degrade", signal="decode", z=2.7, ema=14.8,
                              baseline=9.6, explanation={"detail": "evidence 9.1 sd"})
    c = Client()
    c.force_login(users["viewer"])
    row = c.get("/").content.decode().split(f">{node.name}</a></th>")[1].split("</tr>")[0]
    assert "slower than its peers on decode time per token" in row
    page = c.get(f"/nodes/{node.pk}/").content.decode()
    assert "Z=2.70 on <strong>decode</strong>; EMA 14.800 ms/token, peer baseline 9.600 ms/token" in page
    # The fixture's norm transitions read as ratios to the cost model.
    quarantined = c.get(f"/nodes/{fleet['nodes'][0].pk}/").content.decode()
    assert "on <strong>norm</strong>; EMA 2.000 x expected, peer baseline 1.000 x expected" in quarantined
