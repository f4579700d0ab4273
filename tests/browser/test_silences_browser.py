"""Silences in real headless Chromium: reject a proposal with a chosen silence, see it listed on the
Approvals page, expire it (issue 16 item 2)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from outlier_admin.control.models import AuditEvent, QuarantineProposal, Silence
from tests.browser.conftest import chromium_page
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reject_silences_then_expire(live_server, fleet):
    Group.objects.get_or_create(name="operator")  # a transactional test before this one flushed the roles
    make_user("decider", "operator")
    url, proposal = live_server.url, fleet["proposal"]
    with chromium_page() as page:
        page.goto(f"{url}/approvals/")
        page.get_by_label("Username").fill("decider")
        page.get_by_label("Password").fill("pw-decider")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{url}/approvals/")
        assert page.get_by_text("No silence in force.").is_visible()

        page.get_by_label("Reason (recorded in the audit log)").fill("known slow rack, tolerated tonight")
        select = page.get_by_label("If rejected, no new")
        assert select.input_value() == "3600"  # the default: 1 hour
        select.select_option(label="4 hours")
        page.get_by_role("button", name="Reject").click()
        page.get_by_text(f"Proposal {proposal.pk} for {proposal.node.name}: rejected").wait_for()

        silence = Silence.objects.get(proposal=proposal)
        assert (silence.expires_at - silence.created_at).total_seconds() == 4 * 3600
        row = page.locator("tr", has=page.get_by_role("button", name="Expire"))
        assert row.count() == 1 and proposal.node.name in row.inner_text()
        row.get_by_label("Reason").fill("rack fixed, watch it again")
        row.get_by_role("button", name="Expire").click()
        page.get_by_text(f"Silence {silence.pk} for {proposal.node.name} expired.").wait_for()
        assert page.get_by_text("No silence in force.").is_visible()

    assert QuarantineProposal.objects.get(pk=proposal.pk).status == "rejected"
    silence.refresh_from_db()
    assert not silence.is_active() and silence.expired_by == "decider"
    assert AuditEvent.objects.filter(action="silence.expire", actor="decider").count() == 1
