"""deploy/prometheus/ (rules) and deploy/grafana/ (dashboard) name only series outlier-admin exports (or
the rules record), and the rules pass promtool's check and unit tests where promtool is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from outlier_admin.observability import metrics

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "outlier-admin-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "outlier-admin-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "outlier-admin.json"
SERIES = re.compile(r"\boutlier[_:][a-z0-9_:]*[a-z0-9_]")
PROMTOOL = shutil.which("promtool")


@pytest.fixture
def exported(db, redis_client, make_group):
    """Every series name /metrics serves (with a group and a node, so the fleet families are there)."""
    from outlier_admin.control.actions import do_register_node

    do_register_node(make_group("rules-g"), "127.0.0.1:8000", actor="test")
    names: set[str] = set()
    for line in metrics.render().decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            base = name.removesuffix("_total")
            names |= {name, base}
            if kind == "counter":
                names.add(base + "_total")
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def _rules() -> list[dict]:
    return [rule for g in yaml.safe_load(RULES.read_text())["groups"] for rule in g["rules"]]


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in doc["templating"]["list"] if v.get("type") == "query"]
    return exprs


def test_rules_and_dashboard_name_only_exported_or_recorded_series(exported):
    recorded = {r["record"] for r in _rules() if "record" in r}
    assert recorded and all(name.startswith("outlier:") for name in recorded)
    exprs = [r["expr"] for r in _rules()] + _dashboard_exprs()
    named = {m for e in exprs for m in SERIES.findall(e)}
    unknown = {n for n in named if n not in exported and n not in recorded}
    assert not unknown, f"not exported by /metrics nor recorded: {sorted(unknown)}"
    # Every recording rule is read by an alert, the dashboard or another recording rule.
    readers = [r["expr"] for r in _rules()] + _dashboard_exprs()
    assert recorded <= {m for e in readers for m in SERIES.findall(e)}

def test_one_group_label_and_known_severities():
    text = RULES.read_text() + DASHBOARD.read_text()
    assert "model_group" not in text
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert rule["labels"]["source"] == "prometheus"
    doc = json.loads(DASHBOARD.read_text())
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in check.stdout
    unit = subprocess.run([PROMTOOL, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent,
                          capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0, unit.stdout + unit.stderr
