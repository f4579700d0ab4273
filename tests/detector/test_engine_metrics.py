"""detector.engine_metrics: a model server's /metrics -> progress rows (decode and queue-free prefill)."""

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from detector.engine_metrics import (
    _ITL_PAIRS,
    _MARKS,
    _SELECTORS,
    _SOURCES,
    ROW_FIELDS,
    EngineCounters,
    parse,
    progress_row,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def _reference(text: str, sample: str) -> float | None:
    """The same total by prometheus_client's full parser (the reference implementation)."""
    values = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == sample]
    return sum(values) if values else None


@pytest.mark.parametrize("fixture,prefix", [("datadog-vllm_metrics.txt", "vllm:"),
                                            ("datadog-sglang_metrics.txt", "sglang:")])
def test_every_field_equals_the_full_parsers_total(fixture, prefix):
    from detector.engine_metrics import _SOURCES

    text = (FIXTURES / fixture).read_text()
    counters = parse(text)
    assert counters is not None
    for field_name, names in _SOURCES.items():
        expected = next((v for n in names if n.startswith(prefix) and (v := _reference(text, n)) is not None), None)
        if field_name == "itl_count":  # taken from the same server pair as the sum
            continue
        assert getattr(counters, field_name) == pytest.approx(expected), field_name


def test_a_page_mixing_v0_and_v1_takes_the_v1_inter_token_pair():
    c = parse((FIXTURES / "datadog-vllm_metrics.txt").read_text())
    assert (c.itl_sum_s, c.itl_count) == (pytest.approx(0.6237391703762114), 144.0)


def page(itl=(0.0, 0), prefill=(0.0, 0), computed=(0.0, 0), prompt=(0.0, 0), cache=(0, 0), running=0,
         model="m", processed=0, preemptions=None) -> str:
    """A minimal vLLM V1 exposition, label sets for one model (two models: call twice and join)."""
    lab = f'{{model_name="{model}"}}'
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{lab} {running}",
        f'vllm:inter_token_latency_seconds_bucket{{le="0.01",model_name="{model}"}} 0',
        f"vllm:inter_token_latency_seconds_sum{lab} {itl[0]}",
        f"vllm:inter_token_latency_seconds_count{lab} {itl[1]}",
        f"vllm:request_prefill_time_seconds_sum{lab} {prefill[0]}",
        f"vllm:request_prefill_time_seconds_count{lab} {prefill[1]}",
        f"vllm:request_prefill_kv_computed_tokens_sum{lab} {computed[0]}",
        f"vllm:request_prefill_kv_computed_tokens_count{lab} {computed[1]}",
        f"vllm:request_prompt_tokens_sum{lab} {prompt[0]}",
        f"vllm:request_prompt_tokens_count{lab} {prompt[1]}",
        f"vllm:prefix_cache_queries_total{lab} {cache[0]}",
        f"vllm:prefix_cache_hits_total{lab} {cache[1]}",
        f"vllm:prompt_tokens_total{lab} {processed}",
        *([] if preemptions is None else [f"vllm:num_preemptions_total{lab} {preemptions}"]),
    ]) + "\n"


def test_row_between_two_scrapes_is_the_deltas_queue_free():
    before = parse(page(itl=(10.0, 500), prefill=(2.0, 20), computed=(20_000, 20), running=7, processed=50_000))
    after = parse(page(itl=(10.6, 520), prefill=(2.5, 24), computed=(24_000, 24), running=9, processed=53_072))
    row = progress_row("127.0.0.1:8000", (100.0, before), 100.25, after)
    assert dict(zip(ROW_FIELDS, row, strict=True)) == {
        "node": "127.0.0.1:8000", "ts": 100.25, "interval_s": 0.25, "tokens": 20, "token_ms": pytest.approx(600.0),
        "prefills": 4, "prefill_ms": pytest.approx(500.0), "prefill_tokens": 4000, "running": 9,
        "prefill_work": 3072,  # prompt tokens processed in the interval (chunks of running prefills too)
        "kv_usage": None,  # not on this page
        "preempted": None,  # nor this
    }
    # vLLM counts the requests it preempted (their KV cache evicted): the row carries the interval's.
    before = parse(page(itl=(10.0, 500), running=7, preemptions=40))
    after = parse(page(itl=(10.6, 520), running=9, preemptions=43))
    assert progress_row("127.0.0.1:8000", (100.0, before), 100.25, after)[ROW_FIELDS.index("preempted")] == 3


def test_cache_hits_are_taken_out_of_the_prompt_tokens_without_the_computed_histogram():
    before = EngineCounters(itl_sum_s=1.0, itl_count=10, prefill_sum_s=1.0, prefill_count=10, prompt_sum=10_000,
                            cache_queries=10_000, cache_hits=0)
    after = EngineCounters(itl_sum_s=2.0, itl_count=20, prefill_sum_s=1.2, prefill_count=12, prompt_sum=14_000,
                           cache_queries=14_000, cache_hits=3_000)
    row = progress_row("n", (0.0, before), 1.0, after)
    assert row[ROW_FIELDS.index("prefill_tokens")] == pytest.approx(4_000 * (1 - 3_000 / 4_000))


def test_sglang_prefill_is_ttft_minus_queue():
    before = EngineCounters(itl_sum_s=0.0, itl_count=0, ttft_sum_s=1.0, ttft_count=10, queue_sum_s=0.5,
                            queue_count=10)
    # 5 first tokens in 3.0 s, of which 5 queue waits of 2.5 s: 0.1 s of prefill each.
    after = EngineCounters(itl_sum_s=0.1, itl_count=5, ttft_sum_s=4.0, ttft_count=15, queue_sum_s=3.0,
                           queue_count=15)
    row = progress_row("n", (0.0, before), 1.0, after)
    assert row[5] == 5 and row[6] == pytest.approx(500.0)


def test_label_sets_are_summed_and_a_restart_gives_no_row():
    two = page(itl=(1.0, 100), model="a") + page(itl=(2.0, 50), model="b")
    c = parse(two)
    assert (c.itl_sum_s, c.itl_count) == (3.0, 150)
    restarted = parse(page(itl=(0.1, 5)))
    assert progress_row("n", (0.0, c), 1.0, restarted) is None
    assert progress_row("n", None, 1.0, c) is None
    assert progress_row("n", (1.0, c), 1.0, c) is None  # no time passed


def test_a_page_without_an_inter_token_histogram_is_none_and_a_bad_value_raises():
    assert parse("# nothing here\nfoo 1\n") is None
    with pytest.raises(ValueError, match="not a number"):
        parse('vllm:inter_token_latency_seconds_sum{model_name="m"} abc\n')
    # A HELP line naming the family is not a sample.
    assert parse("# HELP vllm:inter_token_latency_seconds_sum x 1\n") is None


def test_counters_round_trip_through_a_list_and_an_older_shorter_list_still_reads():
    c = parse((FIXTURES / "datadog-vllm_metrics.txt").read_text())
    assert EngineCounters.from_list(c.to_list()) == c
    assert EngineCounters.from_list([1.0, 2.0]) == EngineCounters(itl_sum_s=1.0, itl_count=2.0)


# -- generated pages: the fast reader against prometheus_client's full parser -------------------------
# Histogram stems and plain series we read, plus decoys: a longer name that begins with one of ours,
# a shorter one that ours begin with, and another server's family.
_BARE = {name for name, _sel in _SELECTORS.values()}
_HIST_STEMS = sorted({n.rsplit("_", 1)[0] for n in _BARE if n.endswith(("_sum", "_count"))}
                     | {"vllm:e2e_request_latency_seconds"})
_PLAIN = sorted({n for n in _BARE if not n.endswith(("_sum", "_count"))}
                | {"vllm:num_requests_running_max", "vllm:num_requests", "vllm:prefix_cache_hits_total_x"})
# Label names and values the selectors of _SOURCES name (TGI's method, Triton's categories), and others.
_SELECTED = sorted({sel for _name, sel in _SELECTORS.values() if sel})
_label_value = st.text(alphabet='abz09-_./} {"\\\n', max_size=8)
_value = st.one_of(st.integers(0, 10**9), st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
                   st.sampled_from(["NaN", "+Inf", "1e3", "2.5E-3", "0"]))


def _fmt(v) -> str:
    return v if isinstance(v, str) else repr(v)


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    esc = {k: v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for k, v in pairs.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


@st.composite
def pages(draw) -> str:
    """A valid text exposition: histogram and plain families in any order, 0-3 label sets each,
    optional timestamps."""
    lines: list[str] = []
    hists = draw(st.lists(st.sampled_from(_HIST_STEMS), unique=True, max_size=8))
    plains = draw(st.lists(st.sampled_from(_PLAIN), unique=True, max_size=8))
    families = [("h", n) for n in hists] + [("p", n) for n in plains]
    for kind, name in draw(st.permutations(families)):
        label_sets = draw(st.lists(st.dictionaries(st.sampled_from(["model_name", "engine"]), _label_value,
                                                   max_size=2), max_size=3))
        for labels in label_sets:  # some label sets hold a pair a selector names
            if draw(st.booleans()):
                key, _eq, value = draw(st.sampled_from(_SELECTED)).partition("=")
                labels[key] = value.strip('"')
        ts = draw(st.sampled_from(["", " 1700000000000"]))
        if kind == "h":
            lines += [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
            for labels in label_sets:
                for le in ("0.1", "1.0", "+Inf"):
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': le})} {_fmt(draw(_value))}")
                lines.append(f"{name}_sum{_labels(labels)} {_fmt(draw(_value))}{ts}")
                lines.append(f"{name}_count{_labels(labels)} {_fmt(draw(_value))}{ts}")
        else:
            lines += [f"# HELP {name} A series.", f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}"]
            lines += [f"{name}{_labels(labels)} {_fmt(draw(_value))}{ts}" for labels in label_sets]
    return "\n".join(lines) + "\n"


def _finite_reference(text: str, source: str) -> float | None:
    """prometheus_client's total of the finite samples of ``source`` (a name, or ``name{label="v"}``:
    those with that label; a NaN or infinite sample is skipped by the rule of ``parse``: it would
    poison every delta after it)."""
    name, sel = _SELECTORS.get(source, (source, None))
    key, _eq, want = (sel or "").partition("=")
    values = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples
              if s.name == name and math.isfinite(s.value) and (sel is None or s.labels.get(key) == want.strip('"'))]
    if not values:
        return None
    return sum(values) * (1e-6 if "timestamp" in source else 1.0)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages())
def test_generated_pages_read_the_same_as_the_full_parser(text):
    counters = parse(text)
    itl = next(((s, c) for s, c in _ITL_PAIRS if _finite_reference(text, s) is not None), None)
    if itl is None:
        # Another engine's page, recognised by the names of its families (first in _MARKS), or no engine's.
        names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
        engine = next((engine for engine, marks in _MARKS if not marks.isdisjoint(names)), None)
        assert (counters.engine if counters else None) == engine
        if counters is None:
            return
    else:
        assert counters.engine == itl[0].partition(":")[0]
        assert counters.itl_sum_s == pytest.approx(_finite_reference(text, itl[0]))
        assert counters.itl_count == pytest.approx(_finite_reference(text, itl[1]) or 0.0)
    for field_name, names in _SOURCES.items():
        if field_name in ("itl_sum_s", "itl_count"):
            continue
        expected = next((v for n in names if (v := _finite_reference(text, n)) is not None), None)
        assert getattr(counters, field_name) == pytest.approx(expected), field_name


def test_the_value_is_after_the_last_brace_and_an_unclosed_brace_is_an_error():
    # A label value may hold "}" and spaces: the value is what follows the line's last "}".
    c = parse('vllm:inter_token_latency_seconds_sum{model_name="a} 7"} 2.5 1700000000000\n'
              'vllm:inter_token_latency_seconds_count{model_name="a} 7"} 10\n')
    assert (c.itl_sum_s, c.itl_count) == (2.5, 10.0)
    with pytest.raises(ValueError, match="not a number"):
        parse('vllm:inter_token_latency_seconds_sum{model_name="m" 1\n')
