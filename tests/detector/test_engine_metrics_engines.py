"""detector.engine_metrics on the engines without an inter-token histogram (llama.cpp with and without
/slots, TGI, trtllm-serve, Triton's TensorRT-LLM backend), on their fixture pages (real llama.cpp
captures; the others reconstructed from their sources: tests/fixtures/<engine>/README.md)."""

from dataclasses import replace
from pathlib import Path

import pytest

from detector.engine_metrics import ROW_FIELDS, EngineCounters, parse, progress_row
from detector.engines.llamacpp import MAX_SLOTS, SlotsError, parse_slots, slots_from_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LC = FIXTURES / "llamacpp"
# The two llama.cpp polls' clocks (tests/fixtures/llamacpp/README.md).
T_A, T_B = 1796425583.439176, 1796425583.6908524


def page(engine: str, tag: str) -> EngineCounters:
    c = parse((FIXTURES / engine / f"metrics_{tag}.txt").read_text())
    assert c is not None and c.engine == engine
    return c


def row(prev: EngineCounters, cur: EngineCounters, t0: float = 0.0, t1: float = 0.25) -> dict:
    r = progress_row("127.0.0.1:8080", (t0, prev), t1, cur)
    assert r is not None
    return dict(zip(ROW_FIELDS, r, strict=True))


def llamacpp(tag: str) -> EngineCounters:
    return replace(page("llamacpp", tag), slots=parse_slots((LC / f"slots_{tag}.json").read_text()))


def test_a_real_llamacpp_page_reads_its_counters_and_gauges():
    a = page("llamacpp", "a")
    assert (a.prompt_total, a.prompt_s, a.gen_tokens, a.gen_s) == (180.0, 0.554365, 160.0, 7.22483)
    assert (a.running, a.waiting, a.itl_count) == (2.0, 0.0, None)


def test_llamacpp_row_from_two_real_slots_snapshots():
    # Task 4 decodes 159 -> 165 over the whole interval; task 5's prompt (90 tokens) finishes in it,
    # and the prompt counters moved by exactly its tokens: one prefill of 297 ms.
    r = row(llamacpp("a"), llamacpp("b"), T_A, T_B)
    interval_ms = (T_B - T_A) * 1000.0
    assert r["tokens"] == 6 and r["token_ms"] == pytest.approx(interval_ms)  # one stream: 42 ms per token
    assert (r["prefills"], r["prefill_ms"], r["prefill_tokens"]) == (1, pytest.approx(296.983), 90)
    assert (r["running"], r["prefill_work"]) == (2, 90)


def test_llamacpp_slots_that_made_no_progress_are_a_censored_row_not_nothing():
    b = llamacpp("b")  # both slots generating; the same snapshot 250 ms later: a stalled node
    r = row(b, b)
    assert r["tokens"] == 0 and r["token_ms"] == pytest.approx(2 * 250.0)  # two streams, stalled
    assert (r["prefills"], r["prefill_ms"], r["prefill_tokens"]) == (0, 0.0, 0)


def test_llamacpp_prefill_is_none_when_the_slots_and_the_counters_disagree():
    a, b = llamacpp("a"), llamacpp("b")
    # The counters also hold a request that began and ended between the two scrapes.
    r = row(a, replace(b, prompt_total=b.prompt_total + 40, prompt_s=b.prompt_s + 0.1))
    assert (r["prefills"], r["prefill_ms"], r["prefill_tokens"]) == (None, None, None)
    assert r["tokens"] == 6  # decode does not depend on it


def test_llamacpp_without_slots_falls_back_to_the_finished_request_counters():
    a = page("llamacpp", "a")
    # 200 tokens of requests that ended in the interval, in 9.699 s of their own decode time.
    later = replace(a, gen_tokens=360.0, gen_s=16.9239)
    r = row(a, later)
    assert r["tokens"] == 200 and r["token_ms"] == pytest.approx(9699.07)
    assert r["prefills"] is None and r["running"] is None  # no prefill count; late tokens: no gauge
    assert row(a, page("llamacpp", "b"))["tokens"] == 0  # no request ended: nothing to say (late)
    # /slots at one end only: neither source, so no token is counted twice.
    assert row(a, llamacpp("b"))["token_ms"] == 0 and row(llamacpp("a"), later)["tokens"] == 0


def test_llamacpp_restart_rebases():
    b = llamacpp("b")
    assert progress_row("n", (0.0, b), 1.0, replace(b, prompt_total=0.0, prompt_s=0.0)) is None


def test_slots_documents_are_validated_with_a_reason():
    assert parse_slots((LC / "slots_idle.json").read_text()) == ()
    assert parse_slots((LC / "slots_a.json").read_text()) == ((0, 4, 159, 90, 0, 0.0), (1, 5, 0, 0, 0, 0.0))
    # An older server: "state" and a next_token object.
    assert slots_from_json([{"id": 3, "state": 1, "id_task": 7, "n_prompt_tokens_processed": 12,
                             "next_token": {"n_decoded": 4}}, {"id": 1, "state": 0}]) == ((3, 7, 4, 12, 0, 0.0),)
    ok = {"id": 0, "is_processing": True, "id_task": 1, "n_prompt_tokens_processed": 5, "next_token": [{"n_decoded": 2}]}
    bad = {
        "not a list": {"slots": []},
        "more than": [{"id": i, "is_processing": False} for i in range(MAX_SLOTS + 1)],
        "twice": [ok, ok],
        "id is not an integer": [{**ok, "id": True}],
        "id_task -1 outside": [{**ok, "id_task": -1}],
        "n_decoded 1000000000000 outside": [{**ok, "next_token": [{"n_decoded": 10**12}]}],
        "n_decoded is not an integer": [{**ok, "next_token": [{"n_decoded": 2.5}]}],
        "next_token is not": [{**ok, "next_token": []}],
        "is_processing is not a boolean": [{"id": 0, "is_processing": "yes"}],
        "n_prompt_tokens_processed is not": [{k: v for k, v in ok.items() if k != "n_prompt_tokens_processed"}],
        "slot 0 is not an object": [[1, 2]],
    }
    for reason, doc in bad.items():
        with pytest.raises(SlotsError, match=reason):
            slots_from_json(doc)
    with pytest.raises(SlotsError, match="not JSON"):
        parse_slots("[{")
    with pytest.raises(SlotsError, match="not JSON"):
        parse_slots("[" * 100_000)  # nesting deeper than any decoder recursion


def test_tgi_decode_is_its_decode_steps_times_the_batch():
    a, b = page("tgi", "a"), page("tgi", "b")
    assert (a.steps, a.decoding, a.waiting) == (120_000, 8, 2)  # the method="prefill" series kept apart
    r = row(a, b)
    # 10 decode steps of 25 ms, each one token for each of 8 streams: 25 ms per token, 8 streams.
    assert r["tokens"] == 80 and r["token_ms"] == pytest.approx(2000.0) and r["running"] == 8
    assert (r["prefills"], r["prefill_tokens"], r["prefill_work"], r["kv_usage"]) == (None, None, None, None)
    stalled = row(b, b)  # a batch there at both scrapes and no step between them
    assert stalled["tokens"] == 0 and stalled["token_ms"] == pytest.approx(8 * 250.0)
    idle = row(replace(b, decoding=0.0), replace(b, decoding=0.0))
    assert (idle["tokens"], idle["token_ms"]) == (0, 0)


def test_trtllm_decode_and_prefill_come_from_the_finished_requests():
    r = row(page("trtllm", "a"), page("trtllm", "b"))
    # 3 requests of 200 tokens (199 decode gaps each at 30 ms); 150 ms prefills of 1,000 computed tokens.
    assert r["tokens"] == 597 and r["token_ms"] / r["tokens"] == pytest.approx(30.0)
    assert (r["prefills"], r["prefill_ms"]) == (3, pytest.approx(450.0))
    assert r["prefill_tokens"] == pytest.approx(3000.0) and r["prefill_work"] == pytest.approx(3000.0)
    # Late tokens carry no running gauge (a busy node between two completions is not a stall).
    assert (r["running"], r["kv_usage"]) == (None, 0.41)


def test_triton_decode_is_iterations_times_generation_requests():
    a, b = page("triton", "a"), page("triton", "b")
    assert a.steps_s == pytest.approx(1796425583.401234)  # the µs timestamp gauge, in seconds
    r = row(a, b)
    assert r["tokens"] == 160 and r["token_ms"] == pytest.approx(16 * 250.0)  # 25 ms per iteration
    assert (r["running"], r["kv_usage"], r["prefills"]) == (17, 0.4875, None)
    stalled = row(b, b)
    assert stalled["tokens"] == 0 and stalled["token_ms"] == pytest.approx(16 * 250.0)
    assert progress_row("n", (0.0, b), 0.25, a) is None  # the iteration counter went down: re-base


def test_a_page_no_engine_wrote_is_none():
    assert parse((FIXTURES / "dcgm" / "datadog-dcgm-metrics.txt").read_text()) is None
    assert parse("# HELP llamacpp:prompt_tokens_total x\n# TYPE llamacpp:prompt_tokens_total counter\n") is None


def test_counters_with_slots_round_trip_and_a_damaged_stored_list_is_refused():
    b = llamacpp("b")
    assert EngineCounters.from_list(b.to_list()) == b
    with pytest.raises(ValueError):
        EngineCounters.from_list([*b.to_list()[:-2], "nginx", None])
    with pytest.raises(TypeError):
        EngineCounters.from_list(["1.0", 2.0])
