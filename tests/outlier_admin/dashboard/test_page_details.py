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
