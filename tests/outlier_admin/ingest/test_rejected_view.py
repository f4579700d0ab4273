"""The rejected-input view in the API and the dashboard: counts by reason (and the format a line
looks like), samples with the raw line; readable by every role, by no one else."""

from __future__ import annotations

import time

import pytest

from contract.logformats import FORMATS, ParseError
from outlier_admin.ingest.pipeline import submit
from tests.conftest import FIXTURES
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.django_db, pytest.mark.services]
LOGS = FIXTURES / "gateway-logs"


def parsed(fmt: str, lines: list[str]):
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            out.append((i, FORMATS[fmt](line), line))
        except ParseError as exc:
            out.append((i, exc, line))
    return out


@pytest.fixture
def refused(redis_client, make_group):
    """Through the real pipeline: 6 nginx combined lines (no node), an Envoy text line given to the
    nginx parser, a pushed record without a node, and one accepted latency-only record."""
    make_group("llm")
    combined = (LOGS / "nginx-1.22-combined.log").read_text().splitlines()
    envoy_text = (LOGS / "envoy-default-format-example.log").read_text().strip()
    out = submit(parsed("auto", combined) + parsed("nginx", [envoy_text]), source="log:gw", default_group="llm")
    assert (out.accepted, out.rejected) == (0, 7)
    out = submit([(1, {"ts": time.time(), "group": "llm", "total_ms": 5.0}, None),
                  (2, {"ts": time.time(), "node": "127.0.0.1:8000", "group": "llm", "total_ms": 5.0}, None)],
                 source="http:gw-test")
    assert (out.accepted, out.latency_only, out.rejected) == (1, 1, 1)
    return combined[0]


def login(client, role: str | None):
    if role:
        client.force_login(make_user(role, *([role] if role != "norole" else [])))


@pytest.mark.parametrize(("role", "status"), [(None, 401), ("norole", 403), ("viewer", 200), ("operator", 200),
                                              ("oncall", 200)])
def test_api_roles(client, refused, role, status):
    login(client, role)
    assert client.get("/api/v1/rejected-input/summary/").status_code == status
    assert client.get("/api/v1/rejected-input/").status_code == status


def test_api_counts_by_reason_and_samples_with_the_raw_line(client, refused):
    login(client, "viewer")
    summary = client.get("/api/v1/rejected-input/summary/").json()
    assert summary["total"] == 8
    assert [(r["count"], r["reason"], r["looks_like"], r["source"]) for r in summary["by_reason"]] == [
        (6, "no_upstream", "nginx", "log:gw"), (1, "missing_node", "", "http:gw-test"),
        (1, "wrong_format", "envoy", "log:gw")]
    assert summary["by_reason"][0]["format_label"] == "nginx (combined / ingress-nginx)"
    samples = client.get("/api/v1/rejected-input/", {"reason": "no_upstream", "looks_like": "nginx"}).json()
    # The 6 lines are one line six times: one sample that stands for the six refusals.
    assert samples["count"] == 1 and samples["results"][0]["raw"] == refused
    assert samples["results"][0]["count"] == 6
    assert "--node-map" in samples["results"][0]["detail"]
    wrong = client.get("/api/v1/rejected-input/", {"reason": "wrong_format"}).json()["results"][0]
    assert "looks like Envoy" in wrong["detail"] and wrong["raw"].startswith("[2016-04-15T20:17:00.310Z]")


def test_api_refuses_unknown_parameters_and_bad_dates(client, refused):
    login(client, "viewer")
    assert client.get("/api/v1/rejected-input/summary/", {"since": "yesterday"}).status_code == 400
    assert client.get("/api/v1/rejected-input/summary/", {"reasn": "x"}).status_code == 400
    future = client.get("/api/v1/rejected-input/summary/", {"since": "2999-01-01T00:00:00Z"}).json()
    assert future["total"] == 0


@pytest.mark.parametrize(("role", "status"), [("norole", 403), ("viewer", 200)])
def test_dashboard_page(client, refused, role, status):
    login(client, role)
    resp = client.get("/rejected/", {"reason": "no_upstream"})
    assert resp.status_code == status
    if status == 200:
        html = resp.content.decode()
        assert "<td>6</td><td><code>no_upstream</code></td><td>nginx (combined / ingress-nginx)</td>" in html
        assert "1 samples" in html and "&quot;POST /v1/completions HTTP/1.1&quot;" in html  # raw, escaped
        assert '<td>6</td><td>log:gw : 1</td>' in html  # the sample stands for the six refusals


def test_dashboard_needs_a_login(client, refused):
    resp = client.get("/rejected/")
    assert resp.status_code == 302 and "/accounts/login/" in resp["Location"]
