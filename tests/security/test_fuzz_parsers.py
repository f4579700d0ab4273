"""Property-based fuzzing of every parser: ingest records, Envoy/nginx/HAProxy/JSONL log lines, DCGM
text, scenario files, ``Thresholds.from_dict`` and the threshold form. Contract: no crash — every
input either parses or is refused with the parser's own error carrying a reason/field; and through
the HTTP ingest endpoint every bad item is counted and stored with its reason."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.logformats import FORMATS, ParseError
from contract.normalize import RecordError, normalize
from detector.thresholds import ThresholdError, Thresholds
from sim.scenario import ScenarioError, parse_scenario

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
# The production defaults of the INGEST_* bounds (outlier_admin.settings).
BOUNDS = {"max_future_s": 300, "retention_s": 3600, "max_latency_ms": 3_600_000,
          "max_prompt_tokens": 10_000_000, "max_completion_tokens": 1_000_000}
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
RECORD_KEYS = ["ts", "node", "group", "prompt_tokens", "completion_tokens", "ttft_ms", "total_ms", "status",
               "request_id"]


@st.composite
def records(draw):
    """Mostly well-formed records with some fields replaced by anything JSON can hold."""
    now = 1_767_225_600.0
    rec = {"ts": now - draw(st.floats(-1000, 10_000)), "node": "127.0.0.1:8000", "group": "g1",
           "prompt_tokens": draw(st.integers(0, 5000)), "completion_tokens": draw(st.integers(0, 5000)),
           "ttft_ms": draw(st.floats(0, 1e5)), "total_ms": draw(st.floats(0, 1e6)), "status": 200}
    for key in draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=4)):
        if draw(st.booleans()):
            rec[key] = draw(json_values)
        else:
            rec.pop(key, None)
    return rec


@FAST
@given(st.one_of(records(), json_values))
def test_ingest_record_normalize_accepts_or_refuses_with_a_reason(obj):
    try:
        rec = normalize(obj, now=1_767_225_600.0, **BOUNDS)
    except RecordError as exc:
        assert exc.reason and isinstance(exc.reason, str)
        return
    assert math.isfinite(rec["ts"]) and 0 < rec["total_ms"] <= BOUNDS["max_latency_ms"]
    # Latency-only (no token counts): both None; else both within their bounds.
    assert (rec["prompt_tokens"] is None) == (rec["completion_tokens"] is None)
    if rec["prompt_tokens"] is not None:
        assert 0 <= rec["prompt_tokens"] <= BOUNDS["max_prompt_tokens"]
        assert 0 <= rec["completion_tokens"] <= BOUNDS["max_completion_tokens"]
    assert isinstance(rec["node"], str) and rec["node"]
    assert 1_767_225_600.0 - 3600 <= rec["ts"] <= 1_767_225_600.0 + 300


def _sample_lines() -> dict[str, list[str]]:
    def lines(path: Path) -> list[str]:
        return [x for x in path.read_text().splitlines() if x.strip()][:20]

    return {
        # Our nginx log_format appends the token counts to the ingress-controller format.
        "nginx": [x + " prompt_tokens=120 completion_tokens=30"
                  for x in lines(FIX / "gateway-logs" / "beats-nginx-ingress-controller-test.log")],
        "envoy": lines(FIX / "gateway-logs" / "envoy-ai-gateway-accesslog.jsonl"),
        "jsonl": [orjson.dumps({"ts": 1.0, "node": "n", "total_ms": 5}).decode()],
        "haproxy": lines(FIX / "haproxy" / "configuration-txt-http-log-samples.log"),
        "litellm": [orjson.dumps(orjson.loads((FIX / "gateway-logs" / "litellm-standard-logging-payload.json")
                                              .read_bytes())).decode()],
        "openai": lines(FIX / "gateway-logs" / "openai-usage-accesslog.jsonl"),
    }


SAMPLES = _sample_lines()
SAMPLES["auto"] = [line for fmt_lines in SAMPLES.values() for line in fmt_lines]


@st.composite
def mutated_line(draw, fmt: str):
    base = draw(st.sampled_from(SAMPLES[fmt] or [""]))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.text(max_size=300))
    if kind == 1 and base:  # cut
        i = draw(st.integers(0, len(base)))
        return base[:i]
    if kind == 2 and base:  # replace a slice with junk
        i = draw(st.integers(0, len(base)))
        j = draw(st.integers(i, len(base)))
        return base[:i] + draw(st.text(max_size=20)) + base[j:]
    return base


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_log_line_parsers_parse_or_refuse_with_a_reason(fmt):
    parser = FORMATS[fmt]

    @FAST
    @given(mutated_line(fmt))
    def check(line):
        try:
            obj = parser(line)
        except ParseError as exc:
            assert exc.reason
            return
        assert isinstance(obj, dict)
        # What a parser yields then goes through normalize: a record or a reasoned refusal.
        try:
            normalize(obj, now=time.time(), **{**BOUNDS, "retention_s": 10**10})
        except RecordError as exc:
            assert exc.reason

    check()


def test_log_parsers_accept_their_real_fixture_lines():
    """The fuzz above must not pass by refusing everything: the real lines parse."""
    for fmt in ("nginx", "envoy", "jsonl"):
        parsed = 0
        for line in SAMPLES[fmt]:
            try:
                FORMATS[fmt](line)
                parsed += 1
            except ParseError:
                pass
        assert parsed >= 1, fmt


DCGM_TEXT = (FIX / "dcgm" / "datadog-dcgm-metrics.txt").read_text()


@FAST
@given(st.data())
def test_dcgm_text_parses_or_raises_value_error(data):
    from outlier_admin.ingest.dcgm import parse_metrics

    lines = DCGM_TEXT.splitlines()
    kind = data.draw(st.integers(0, 2))
    if kind == 0:
        text = data.draw(st.text(max_size=400))
    else:
        i = data.draw(st.integers(0, len(lines)))
        junk = data.draw(st.text(max_size=60)) if kind == 2 else ""
        text = "\n".join([*lines[:i], junk, *lines[i + 1:]])
    try:
        gpus = parse_metrics(text)
    except ValueError:
        return  # scrape_node keeps it as RejectedInput(reason="scrape_failed")
    assert isinstance(gpus, dict)


SCENARIO = json.loads((ROOT / "scenarios" / "small-group-8.json").read_text())


def _mutate(obj, draw):
    if isinstance(obj, dict) and obj:
        key = draw(st.sampled_from(sorted(obj)))
        choice = draw(st.integers(0, 2))
        out = dict(obj)
        if choice == 0:
            out.pop(key)
        elif choice == 1:
            out[key] = draw(json_values)
        else:
            out[key] = _mutate(obj[key], draw)
        return out
    if isinstance(obj, list) and obj:
        i = draw(st.integers(0, len(obj) - 1))
        return [*obj[:i], _mutate(obj[i], draw), *obj[i + 1:]]
    return draw(json_values)


@settings(FAST, report_multiple_bugs=False)
@given(st.data())
def test_scenario_files_parse_or_name_the_bad_field(data):
    doc = SCENARIO
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(doc, data.draw)
    try:
        parse_scenario(doc, source="fuzz")
    except ScenarioError as exc:
        assert exc.field and exc.message


def test_the_unmutated_scenario_parses():
    assert parse_scenario(SCENARIO, source="small-group-8.json")


THRESHOLD_NAMES = sorted(Thresholds().to_dict())


@FAST
@given(st.dictionaries(st.sampled_from(THRESHOLD_NAMES) | st.text(max_size=12), json_values, max_size=5))
def test_thresholds_from_dict_builds_or_names_the_field(data):
    try:
        th = Thresholds.from_dict(data)
    except ThresholdError as exc:
        assert exc.field in data and exc.message  # names the offending key
        return
    assert isinstance(th, Thresholds)
    assert Thresholds.from_dict(th.to_dict()) == th


@pytest.mark.django_db
def test_threshold_form_validates_or_names_the_field():
    from outlier_admin.dashboard.forms import ThresholdForm

    @settings(max_examples=100, deadline=None)
    @given(st.dictionaries(st.sampled_from([*THRESHOLD_NAMES, "reason"]), st.text(max_size=12), max_size=6))
    def check(post):
        form = ThresholdForm(post, current=Thresholds())
        if form.is_valid():
            changes = form.changes()
            try:
                Thresholds.from_dict({**Thresholds().to_dict(), **changes})
            except ThresholdError as exc:  # the view turns this into a 400 naming exc.field
                assert exc.field in changes
        else:
            assert all(form.errors.values())

    check()


@pytest.mark.django_db
@pytest.mark.services
def test_ingest_endpoint_never_500_and_keeps_every_bad_item(client, ingest_token, redis_client):
    from outlier_admin.ingest.rejected import refusal_count

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.one_of(records(), json_values), min_size=1, max_size=8), st.booleans())
    def check(items, as_ndjson):
        now = time.time()
        for rec in items:  # keep the "good" ones inside the acceptance window
            if isinstance(rec, dict) and isinstance(rec.get("ts"), float):
                rec["ts"] = now - (1_767_225_600.0 - rec["ts"]) % 3000
        before = refusal_count()
        if as_ndjson:
            body = b"\n".join(orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY) if not _bad_float(x) else b"{bad"
                              for x in items)
            ctype = "application/x-ndjson"
        else:
            if any(_bad_float(x) for x in items):
                return
            body, ctype = orjson.dumps(items), "application/json"
        resp = client.post("/api/v1/ingest/requests", data=body, content_type=ctype,
                           HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
        assert resp.status_code in (200, 400), resp.content
        out = resp.json()
        if resp.status_code == 400:
            assert out["detail"]
            return
        assert out["accepted"] + out["rejected"] + out["duplicates"] == len(items)
        assert refusal_count() - before == out["rejected"]
        assert all(e["reason"] for e in out["errors"])

    check()


def _bad_float(x) -> bool:
    """orjson refuses NaN/inf? (it writes null) - and big ints beyond 64 bits: those become raw junk."""
    try:
        orjson.dumps(x)
        return False
    except TypeError:
        return True
