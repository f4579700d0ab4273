"""The 3 a.m. screens in real headless Chromium: the first screen lists what is wrong and refreshes
itself, the group page's heatmap renders with its state bands, a node is retired with its
confirmation step, and an unknown page is the styled 404 with the navigation.
Screenshots go to ``reports/screenshots/``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outlier_admin.control.models import AuditEvent, Transition
from outlier_admin.fleet.models import Node
from tests.browser.conftest import SHOTS, recreate_roles
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

def test_first_screen_heatmap_and_retiring_a_node(live_server, fleet, page):
    recreate_roles()
    make_user("night", "viewer", "oncall")
    url = live_server.url
    group, nodes = fleet["group"], fleet["nodes"]

    page.goto(f"{url}/")
    page.get_by_label("Username").fill("night")
    page.get_by_label("Password").fill("pw-night")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")
    attention = page.locator("#attention")
    assert attention.is_visible()
    rows = attention.locator("tbody tr")
    assert rows.count() == 1 and nodes[0].name in rows.first.inner_text()
    assert "much slower than its peers" in rows.first.inner_text()
    # The first screen comes before the groups and the transitions (collapsed).
    assert attention.bounding_box()["y"] < page.locator("#groups").bounding_box()["y"]
    assert not page.locator("#recent table").is_visible()

    # A node degrades while the page is open: it appears without a reload (live refresh).
    Node.objects.filter(pk=nodes[2].pk).update(state="degraded", weight=40)
    Transition.objects.create(group=group, node=nodes[2], at=fleet["now"] + timedelta(seconds=1),
                              from_state="healthy", to_state="degraded", reason="z_degrade", z=2.5)
    page.locator("#attention tbody tr", has_text=nodes[2].name).wait_for(timeout=20_000)
    assert page.locator("#live-overview[data-refreshed-at]").count() == 1
    page.screenshot(path=str(SHOTS / "first-screen.png"), full_page=True)

    page.get_by_role("link", name=group.name).first.click()
    heat = page.locator("#heatmap svg.heatmap")
    heat.wait_for()
    assert heat.locator("g.heat-row").count() == 8
    assert heat.locator("rect.band-quarantined").count() >= 1 and heat.locator("rect.cell").count() > 100
    box = heat.bounding_box()
    assert box is not None and box["width"] > 900  # the full width of the page
    first_row = page.locator("#nodes tbody tr").first
    assert nodes[2].name in first_row.inner_text() or nodes[0].name in first_row.inner_text()
    page.screenshot(path=str(SHOTS / "group-heatmap.png"), full_page=True)

    page.goto(f"{url}/nodes/{nodes[5].pk}/")
    page.get_by_role("link", name="Retire…").click()
    page.get_by_label("Reason (recorded in the audit log)").fill("bogus node from a broken log shipper")
    page.get_by_role("button", name="Continue…").click()
    assert Node.objects.get(pk=nodes[5].pk).retired is False  # not before "Yes"
    page.get_by_role("button", name=f"Yes, retire {nodes[5].name}").click()
    page.wait_for_url(f"{url}/groups/{group.slug}/")
    assert page.get_by_text(f"{nodes[5].name} retired").is_visible()
    assert page.locator("#nodes tbody tr").count() == 7
    assert Node.objects.get(pk=nodes[5].pk).retired
    assert AuditEvent.objects.get(action="node.retire").actor == "night"

    page.goto(f"{url}/no-such-page/")
    assert page.get_by_role("heading", name="Not found").is_visible()
    assert page.get_by_role("link", name="Audit log", exact=True).is_visible()
    page.screenshot(path=str(SHOTS / "not-found.png"), full_page=True)
    page.goto("about:blank")  # stop the live refresh before the live server and its database go away
