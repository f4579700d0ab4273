"""The first screen fits a 1400 px wide screen, whatever the names: a group and nodes with long names
(as gateways report them: FQDNs, pod names) in every table of the overview, the recent transitions
open, in real headless Chromium."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from outlier_admin.control.actions import do_create_group, do_pin_weight, do_register_node
from outlier_admin.control.models import Transition
from outlier_admin.fleet.models import Node
from tests.browser.conftest import SHOTS, recreate_roles
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

GROUP = "qwen2-72b-instruct-awq-8xa100-80gb-sxm4-us-east-1-prod-inference-pool-blue"


def long_name(i: int) -> str:
    return f"vllm-qwen2-72b-instruct-awq-{i:02d}.inference-pool-blue.us-east-1.prod.cluster.internal.example"


def test_the_overview_of_a_group_with_long_names_fits_1400_px(live_server, page):
    recreate_roles()
    make_user("night", "viewer", "oncall")
    group = do_create_group(GROUP, actor="setup", policy="approval")
    nodes = [do_register_node(group, f"127.0.0.{i + 1}:8000", actor="setup", name=long_name(i)) for i in range(6)]
    now = timezone.now()
    for node, state, weight in zip(nodes, ("pending_approval", "quarantined", "degraded", "probing", "recovering"),
                                   (5, 0, 35, 0, 20), strict=False):
        Node.objects.filter(pk=node.pk).update(state=state, weight=weight, last_seen=now)
        Transition.objects.create(group=group, node=node, at=now - timedelta(minutes=3), from_state="healthy",
                                  to_state=state, reason="z_degrade", signal="decode", z=4.4, ema=81.2, baseline=55.9,
                                  explanation={"detail": "evidence 9.1 sd over 1.15x the baseline (cut at 8)"})
    do_pin_weight(nodes[5], 50, actor="night", reason="suspect-fan-on-" + long_name(5), expires_in_s=300)

    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/")
    page.get_by_label("Username").fill("night")
    page.get_by_label("Password").fill("pw-night")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")
    page.locator("#recent summary").click()  # the recent transitions too
    assert page.locator("#attention tbody tr").count() == 5 and page.locator("#overrides tbody tr").count() == 1
    assert page.locator("#recent table").is_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    page.screenshot(path=str(SHOTS / "overview-1400.png"), full_page=True)
    assert width <= 1400, width
    # A cut name is whole in its tooltip.
    link = page.locator("#attention a.clip", has_text="vllm-qwen2-72b-instruct-awq-01").first
    assert link.get_attribute("title") == long_name(1)
    page.goto("about:blank")  # stop the live refresh before the live server and its database go away
