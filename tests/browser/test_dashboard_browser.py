"""The dashboard in real headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

One walk through an on-call shift: log in, see the quarantined node and its Z-score chart, approve a
proposal, release a node (with its confirmation step), submit an invalid threshold and read the error.
Screenshots go to ``reports/screenshots/`` (gitignored; CI keeps them as artefacts).
"""

from __future__ import annotations

import pytest

from outlier_admin.control.models import Override, QuarantineProposal
from tests.browser.conftest import SHOTS, recreate_roles
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

def test_oncall_shift(live_server, fleet, page):
    recreate_roles()
    make_user("shift", "operator", "oncall")
    url = live_server.url
    n0, proposal = fleet["nodes"][0], fleet["proposal"]

    page.goto(f"{url}/")
    page.get_by_label("Username").fill("shift")
    page.get_by_label("Password").fill("pw-shift")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")
    assert page.get_by_role("heading", name="Fleet overview").is_visible()

    page.get_by_role("link", name="llama").first.click()
    row = page.locator("tr.row-quarantined")
    assert row.count() == 1 and "quarantined" in row.inner_text()
    page.screenshot(path=str(SHOTS / "group.png"), full_page=True)

    row.get_by_role("link", name=n0.name).click()
    chart = page.locator("#z-chart svg")
    chart.wait_for()
    assert chart.locator("path.series").count() == 1
    assert chart.locator("line.threshold").count() == 2
    assert chart.locator("rect.band").count() == 2  # degraded, then quarantined: one shaded span each
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 80
    page.screenshot(path=str(SHOTS / "node-z-chart.png"), full_page=True)

    page.get_by_role("link", name="Approvals").click()
    page.get_by_label("Reason (recorded in the audit log)").fill("Z 4 on two signals, confirmed in Grafana")
    page.get_by_role("button", name="Approve quarantine").click()
    assert page.get_by_text(f"Proposal {proposal.pk} for {proposal.node.name}: approved").is_visible()
    page.screenshot(path=str(SHOTS / "approvals.png"), full_page=True)
    assert QuarantineProposal.objects.get(pk=proposal.pk).status == "approved"

    page.goto(f"{url}/nodes/{n0.pk}/")
    page.get_by_role("link", name="Release…").click()
    page.get_by_label("Reason (recorded in the audit log)").fill("PCIe riser reseated")
    page.get_by_role("button", name="Continue…").click()
    page.get_by_role("button", name=f"Yes, release {n0.name}").click()
    assert page.get_by_text(f"release of {n0.name} recorded").is_visible()
    page.screenshot(path=str(SHOTS / "released.png"), full_page=True)
    assert Override.objects.get(node=n0).kind == "release"

    page.goto(f"{url}/groups/llama/thresholds/")
    page.get_by_label("max quarantine fraction").fill("1.5")
    page.get_by_label("Reason (recorded in the audit log)").fill("let it quarantine more")
    page.get_by_role("button", name="Save").click()
    error = page.locator("#id_max_quarantine_fraction-error")
    assert "must be in [0, 1], got 1.5" in error.inner_text()
    page.screenshot(path=str(SHOTS / "threshold-error.png"), full_page=True)
