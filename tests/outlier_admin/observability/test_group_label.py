"""One label name for the group in every series the control plane serves: ``group`` (issue 17). A
dashboard or an alert rule joins series on it, so one family calling it ``model_group`` (or ``pool``)
would silently match nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.observability import hooks, metrics

pytestmark = pytest.mark.django_db

GROUP = "label-check-group"


def test_every_series_names_the_group_label_group(redis_client):
    group = do_create_group(GROUP, actor="test")
    for i in range(2):
        do_register_node(group, f"127.0.3.{i}:8000", actor="test")
    hooks.observe_tick(SimpleNamespace(group=GROUP, tick_ms=12.0, publish_latency_ms=1.5, samples=4))
    metrics.TRANSITIONS.labels(GROUP, "degraded").inc()

    families = list(text_string_to_metric_families(metrics.render(fleet=True).decode()))
    carrying, misnamed = set(), []
    for fam in families:
        for sample in fam.samples:
            for key, value in sample.labels.items():
                if value == GROUP:
                    carrying.add(fam.name)
                    if key != "group":
                        misnamed.append((sample.name, key))
    assert not misnamed, f"the group under another label name: {misnamed}"
    # The check saw the families that carry a group, from the database and from the events alike.
    assert {"outlier_node_state", "outlier_group_nodes", "outlier_tick_duration_seconds",
            "outlier_transitions"} <= carrying
    assert not any("model_group" in s.labels for fam in families for s in fam.samples)
