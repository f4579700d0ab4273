"""A simulated node's ``/metrics`` page: vLLM V1's names, valid exposition, read by the production parser."""

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_sim_step_engine import Harness

from detector.engine_metrics import parse, progress_row
from sim.vllm import NodeSettings


def busy_engine():
    h = Harness(NodeSettings(max_num_seqs=4, kv_capacity_tokens=6000, step_jitter_cv=0.0))
    h.run(until=3.0, arrivals=[(0.1 * i, i, 300 + 50 * i, 200) for i in range(10)])
    h.eng.progress_to(3.0)
    return h


def test_page_is_valid_prometheus_text_with_vllm_v1_families():
    h = busy_engine()
    text = h.eng.m.render("llama")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_queue_time_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens"):
        assert fams[name].type == "histogram"
        buckets = [s for s in fams[name].samples if s.name.endswith("_bucket")]
        values = [s.value for s in buckets]
        assert values == sorted(values) and buckets[-1].labels["le"] == "+Inf"
        count = next(s.value for s in fams[name].samples if s.name.endswith("_count"))
        assert values[-1] == count
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert fams[name].type == "gauge"
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"):
        assert fams[name].type == "counter"
    m = h.eng.m
    assert fams["vllm:num_requests_running"].samples[0].value == m.running == 4
    assert fams["vllm:num_requests_waiting"].samples[0].value == m.waiting > 0
    assert fams["vllm:num_preemptions"].samples[0].value == m.preemptions


def test_production_parser_reads_the_engine_exactly_and_rows_are_the_deltas():
    h = busy_engine()
    m = h.eng.m
    first = parse(m.render())
    assert first.itl_count == m.itl.total and first.itl_sum_s == pytest.approx(m.itl.sum)
    assert first.prefill_count == m.prefill.total and first.queue_count == m.queue.total
    assert first.prompt_sum == m.prompt.sum and first.cache_queries == m.cache_queries
    assert (first.running, first.waiting, first.preemptions) == (m.running, m.waiting, m.preemptions)
    assert first.kv_usage == pytest.approx(m.kv_usage)
    tokens0, secs0, done0 = m.itl.total, m.itl.sum, m.prefill.total
    pf_s0, prompt0, processed0, preempted0 = m.prefill.sum, m.prompt.sum, m.prompt_tokens, m.preemptions
    h.run(until=4.0, arrivals=[])
    h.eng.progress_to(4.0)
    second = parse(m.render())
    row = progress_row("n0", (3.0, first), 4.0, second)
    (node, ts, interval, tokens, token_ms, prefills, prefill_ms, prefill_tokens, running, prefill_work, kv_usage,
     preempted) = row
    assert (node, ts, interval) == ("n0", 4.0, 1.0)
    assert tokens == m.itl.total - tokens0 > 0
    assert token_ms == pytest.approx((m.itl.sum - secs0) * 1000)
    assert prefills == m.prefill.total - done0
    assert prefill_ms == pytest.approx((m.prefill.sum - pf_s0) * 1000)
    assert prefill_tokens == m.prompt.sum - prompt0  # no prefix cache: every prompt token computed
    assert running == m.running
    assert prefill_work == m.prompt_tokens - processed0  # prompt tokens the steps processed meanwhile
    assert kv_usage == pytest.approx(m.kv_usage)
    assert preempted == m.preemptions - preempted0
