"""A model server's own ``/metrics`` -> the streamed progress rows the detector reads.

An access-log line arrives when a request ends, and its TTFT includes the wait for a batch slot. The
model server measures what we need as it happens, without the queue, in Prometheus histograms and
counters. Between two scrapes of one node, the deltas of their cumulative values give one **progress
row** (:data:`ROW_FIELDS`)::

    [node, ts, interval_s, tokens, token_ms, prefills, prefill_ms, prefill_tokens, running, prefill_work,
     kv_usage, preempted]

- ``tokens``, ``token_ms``: the decode signal, ``token_ms / tokens`` ms per token **per stream**, and
  ``token_ms / (1000 * interval_s)`` about the number of streams that were decoding. vLLM and SGLang:
  Δcount and 1000·Δsum of the inter-token histogram (vLLM V1 ``vllm:inter_token_latency_seconds``, V0
  ``vllm:time_per_output_token_seconds``, SGLang ``sglang:inter_token_latency_seconds``). Other engines:
  see *Engines* below. A row with ``tokens == 0`` and ``token_ms > 0`` is a node whose streams made no
  progress during the interval (a stall): it is kept, the detector reads it as a censored observation.
- ``prefills``, ``prefill_ms``: how many requests' prefills the row covers and the time they took,
  **queue-free**. vLLM V1's ``vllm:request_prefill_time_seconds`` is the time from a request's first
  scheduling to its first token (the wait in the queue is ``vllm:request_queue_time_seconds``, kept
  apart). Where a server has no prefill histogram (SGLang), the mean prefill is the mean TTFT minus the
  mean queue time of the interval: ``Δttft_sum/Δttft_count - Δqueue_sum/Δqueue_count`` (floored at 0).
- ``prefill_tokens``: the prompt tokens those prefills actually computed. A prefix-cache hit makes a
  prefill legitimately short, so a node that serves more cache hits must not look fast (and its peers
  slow): first choice is vLLM's ``vllm:request_prefill_kv_computed_tokens`` histogram (new KV tokens
  per request, observed at the same moment as the prefill time, so the two deltas cover the same
  requests); else the prompt-token histogram's Δsum (``vllm:request_prompt_tokens``,
  ``sglang:prompt_tokens_histogram``) times the interval's uncached fraction ``1 - Δhits/Δqueries`` of
  the prefix-cache counters (vLLM ``vllm:prefix_cache_{queries,hits}_total``; SGLang
  ``sglang:{prompt,cached}_tokens_total``).
- ``running``: the gauge of requests in the running batch (``vllm:num_requests_running``,
  ``sglang:num_running_reqs``) at the end of the interval.
- ``prefill_work``: the prompt tokens the engine processed during the interval (Δ``vllm:prompt_tokens_total``,
  ``sglang:prompt_tokens_total``). With chunked prefill every step carries prefill chunks next to the
  decodes, and the step time, which every stream shares, grows with them: the decode signal is
  compared at equal prefill work (:mod:`detector.signals`).
- ``kv_usage``: the KV cache's fill at the end of the interval (``vllm:kv_cache_usage_perc``,
  ``sglang:token_usage``): the context every decode step reads, the other load a step time grows with.
- ``preempted``: the requests the engine preempted during the interval (Δ``vllm:num_preemptions_total``):
  their KV cache was evicted and is recomputed (or swapped back) when they resume, so the prompt work
  that follows is the node's own KV pressure, not a client's long prompt (:mod:`detector.group`).

Engines
-------
Which server wrote a page is read from the names on it (:attr:`EngineCounters.engine`); a page none of
them recognises is :func:`parse`'s ``None`` (the scraper's ``unrecognised_engine`` failure, never an
empty row). What each can and cannot show:

- **vLLM, SGLang** (``vllm``, ``sglang``): the inter-token histogram is observed at every token, so
  the decode signal is live and queue-free; prefill as above.
- **llama.cpp server** (``llamacpp``, ``tools/server``). Its ``llamacpp:*`` counters move only at two
  moments of a request: ``prompt_tokens_total`` / ``prompt_seconds_total`` when its prompt is done
  (the first token sampled; cache hits excluded, the time counted from the slot starting the prompt,
  so queue-free), ``tokens_predicted_total`` / ``tokens_predicted_seconds_total`` when it **ends**.
  The live decode signal is ``GET /slots`` (:mod:`detector.engines.llamacpp`, kept in
  :attr:`EngineCounters.slots`): a row is built from the slots processing the same task at both
  scrapes, each adding its Δ``n_decoded`` tokens and the interval's ms (its stream decoded, or stalled,
  for the whole interval), and, when requests end, what the finished-request counters add beyond what
  the rows already counted of them (a healthy request often decodes within two scrapes: without that
  rest a fast node would have almost no decode samples; each token is counted once). Prefill comes from the prompt counters' deltas with ``prefills`` = the
  tasks /slots shows finishing their prompt; it is left ``None`` when the two disagree (a request
  that started and ended between two scrapes, or a prompt finishing between the /slots and the
  /metrics read). Without /slots (``--no-slots``), decode falls back to the finished-request counters:
  still per token and queue-free (``t_token_generation`` starts at the first token), but **late**: a
  request reports its whole decode when it ends, like an access-log line, and a slow request's first
  tokens count toward the interval it ended in. The counters cannot count prefills, so that row has
  no prefill. ``llamacpp:n_decode_total`` (``llama_decode`` calls) moves live, but without a time
  beside it idle time and step time cannot be told apart: not used.
- **Hugging Face TGI** (``tgi``). ``tgi_batch_inference_duration{method="decode"}`` is observed at
  every decode step of the running batch, and every stream of the batch gets one token per step:
  ``tokens = Δsteps·B``, ``token_ms = 1000·Δsum·B`` with ``B`` = ``tgi_batch_current_size`` (a gauge,
  read at the scrape), so ``token_ms / tokens`` is exactly the mean step time (live, queue-free) and
  only the stream count leans on the gauge. TGI runs a prefill as its own forward pass between decode
  steps; that pause is not in the decode histogram (vLLM's inter-token gaps include it). The request
  histograms (``tgi_request_mean_time_per_token_duration``, ``tgi_request_inference_duration``,
  ``tgi_request_queue_duration``) are observed when a request ends (late), and the inference
  duration holds the prefill: not used for decode. Prefill is ``None``: the prefill histogram times
  whole prefill *batches* and no TGI series says how many requests or computed tokens a batch held
  (``tgi_request_input_length`` is observed at validation, before the queue). ``running`` =
  ``tgi_batch_current_size``. A TGI process that has served no request yet may render no ``tgi_*``
  series at all (the exporter writes a series at its first use): unrecognised until then.
- **TensorRT-LLM ``trtllm-serve``** (``trtllm``; names ``trtllm_*``, or ``trtllm:*`` behind Dynamo).
  Every duration is observed when a request **ends** (``return_perf_metrics``): decode is
  ``trtllm_request_decode_time_seconds`` (first to last token; its count is the requests, each with one
  gap fewer than its tokens) against Δ``trtllm_generation_tokens_total`` - those requests: queue-free
  ms per token, late. Prefill is ``trtllm_request_prefill_time_seconds`` (first scheduling to first
  token, queue-free, the queue is ``trtllm_request_queue_time_seconds``), computed tokens Δprompt -
  Δ``trtllm_prompt_cached_tokens_total``; ``prefill_work`` is those computed tokens (late as well).
  ``trtllm_iteration_latency_seconds`` is a gauge of the last iteration only: a sample, not a mean.
- **Triton + TensorRT-LLM backend** (``triton``; ``nv_trt_llm_*``). The batch manager's gauges hold the
  iteration counter and the timestamp of its latest statistics
  (``nv_trt_llm_general_metrics{general_type="iteration_counter"|"timestamp"}``, µs): Δtimestamp /
  Δiterations is the mean iteration time, live and queue-free, and every generation request gets one
  token per iteration: ``tokens = Δiter·G``, ``token_ms = Δts_ms·G`` with ``G`` =
  ``nv_trt_llm_inflight_batcher_metrics{...="generation_requests"}``. An idle gap between two busy
  iterations of the interval would count as step time. No iteration while generation requests were
  there at both scrapes is a stall (``tokens = 0``, ``token_ms = interval·G``). Triton's own
  ``nv_inference_*_duration_us`` counters time its scheduler queue and the model's ``execute``,
  which for the decoupled (streaming) TensorRT-LLM model returns once a request is enqueued: they
  show neither prefill nor decode. No prefill series.

Columns a server does not expose are ``None``. A counter that went down (a server restart) gives no
row: the next scrape re-bases. All label sets of a family (one per served model) are summed, except
where a source names one label (``name{label="value"}``: Triton's and TGI's families hold different
quantities under one name).

Parsing reads only the few sample lines named here (:func:`parse`): a full vLLM page has hundreds
of bucket lines we never need, and a general exposition parser spends most of its time on them. One
regular expression finds them in a single pass: at each line start the names are tried as a trie
(a bucket line fails within a few characters), so the cost is one scan of the page plus about a
microsecond per sample read, not one scan per name as before (see ``scraper_bench`` for figures).
Only the values of the names :func:`parse` asks for are converted. It is pure (stdlib only, no
I/O): the control plane's scraper and the simulator's engines share it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from detector.engines.llamacpp import MAX_CARRY, Slot, slots_row

#: The layout of a progress row; rows of 5 (decode only, written before the prefill columns existed)
#: are still read, their missing columns ``None``.
ROW_FIELDS: tuple[str, ...] = (
    "node", "ts", "interval_s", "tokens", "token_ms", "prefills", "prefill_ms", "prefill_tokens", "running",
    "prefill_work", "kv_usage", "preempted",
)


def _trt(*names: str) -> tuple[str, ...]:
    """trtllm-serve's names, bare (``trtllm_x``) and as Dynamo re-exports them (``trtllm:x``)."""
    return tuple(f"trtllm{sep}{n}" for n in names for sep in ("_", ":"))


_TRITON_ITER = 'nv_trt_llm_general_metrics{general_type="iteration_counter"}'
_TRITON_TS = 'nv_trt_llm_general_metrics{general_type="timestamp"}'
_TRITON_GEN = 'nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests"}'

# Each field: the sample names that give it, first found wins (current name first, then older ones and
# other servers). A histogram field names its ``_sum`` or ``_count`` sample; ``name{label="v"}`` takes
# only the samples with that label.
_SOURCES: dict[str, tuple[str, ...]] = {
    "itl_sum_s": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum",
                  "sglang:inter_token_latency_seconds_sum"),
    "itl_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
                  "sglang:inter_token_latency_seconds_count"),
    "prefill_sum_s": ("vllm:request_prefill_time_seconds_sum", *_trt("request_prefill_time_seconds_sum")),
    "prefill_count": ("vllm:request_prefill_time_seconds_count", *_trt("request_prefill_time_seconds_count")),
    "queue_sum_s": ("vllm:request_queue_time_seconds_sum", "sglang:queue_time_seconds_sum"),
    "queue_count": ("vllm:request_queue_time_seconds_count", "sglang:queue_time_seconds_count"),
    "ttft_sum_s": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"),
    # trtllm's prompt counter moves at request end, with its prefill histogram: the same requests.
    "prompt_sum": ("vllm:request_prompt_tokens_sum", "sglang:prompt_tokens_histogram_sum", *_trt("prompt_tokens_total")),
    "prompt_count": ("vllm:request_prompt_tokens_count", "sglang:prompt_tokens_histogram_count"),
    "computed_sum": ("vllm:request_prefill_kv_computed_tokens_sum",),
    "computed_count": ("vllm:request_prefill_kv_computed_tokens_count",),
    "cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                      "sglang:prompt_tokens_total", *_trt("prompt_tokens_total")),
    "cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
                   "sglang:cached_tokens_total", *_trt("prompt_cached_tokens_total")),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing",
                "tgi_batch_current_size", *_trt("num_requests_running"),
                'nv_trt_llm_request_metrics{request_type="active"}'),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred",
                "tgi_queue_size", *_trt("num_requests_waiting"), 'nv_trt_llm_request_metrics{request_type="waiting"}'),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "llamacpp:kv_cache_usage_ratio", *_trt("kv_cache_utilization"),
                 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    # Appended after prompt_total (a stored list of an older layout still reads); see "Engines".
    "prompt_s": ("llamacpp:prompt_seconds_total",),
    "gen_tokens": ("llamacpp:tokens_predicted_total", *_trt("generation_tokens_total")),
    "gen_s": ("llamacpp:tokens_predicted_seconds_total", *_trt("request_decode_time_seconds_sum")),
    "gen_requests": _trt("request_decode_time_seconds_count"),
    "steps": ('tgi_batch_inference_duration_count{method="decode"}', _TRITON_ITER),
    "steps_s": ('tgi_batch_inference_duration_sum{method="decode"}', _TRITON_TS),
    "decoding": ("tgi_batch_current_size", _TRITON_GEN),
}
#: A source whose unit is not the field's: the factor to it (Triton's timestamp gauge is in µs).
_SCALE = {_TRITON_TS: 1e-6}
#: What says a page is an engine's, for the engines without an inter-token histogram (in this order:
#: Dynamo's trtllm page carries other families beside trtllm's).
_MARKS: tuple[tuple[str, frozenset[str]], ...] = (
    ("llamacpp", frozenset({"llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                            "llamacpp:requests_processing"})),
    ("trtllm", frozenset(_trt("num_requests_running", "generation_tokens_total", "request_decode_time_seconds_count",
                              "prompt_tokens_total"))),
    ("tgi", frozenset({"tgi_batch_current_size", "tgi_queue_size", "tgi_batch_inference_duration_count"})),
    ("triton", frozenset({"nv_trt_llm_general_metrics", "nv_trt_llm_request_metrics"})),
)
#: The engines :func:`parse` recognises (vLLM and SGLang by their inter-token histogram).
ENGINES: tuple[str, ...] = ("vllm", "sglang", *(engine for engine, _ in _MARKS))
# The inter-token family must be one server's pair (a page mixing V0 and V1 series reports both).
_ITL_PAIRS = tuple(zip(_SOURCES["itl_sum_s"], _SOURCES["itl_count"], strict=True))


def _split(source: str) -> tuple[str, str | None]:
    """``'name{label="v"}'`` -> ``('name', 'label="v"')``; a bare name -> ``(name, None)``."""
    name, brace, rest = source.partition("{")
    return (name, rest[:-1]) if brace else (name, None)


_SELECTORS = {s: _split(s) for names in _SOURCES.values() for s in names}
# Each other field with its sources and the sample name each reads (looked up at every parse).
_OTHER_SOURCES = tuple((f, tuple((n, _SELECTORS[n][0]) for n in names)) for f, names in _SOURCES.items()
                       if f not in ("itl_sum_s", "itl_count"))


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """The cumulative values of one scrape (gauges: the current value); ``None``: not exposed.
    ``engine`` is one of :data:`ENGINES`; ``slots`` a llama.cpp ``/slots`` snapshot, when read
    (:func:`detector.engines.llamacpp.slots_from_json`)."""

    itl_sum_s: float | None = None
    itl_count: float | None = None
    prefill_sum_s: float | None = None
    prefill_count: float | None = None
    queue_sum_s: float | None = None
    queue_count: float | None = None
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    prompt_sum: float | None = None
    prompt_count: float | None = None
    computed_sum: float | None = None
    computed_count: float | None = None
    cache_queries: float | None = None
    cache_hits: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None
    prompt_total: float | None = None  # appended last: a stored list of an older layout still reads
    prompt_s: float | None = None  # from here on: the engines without an inter-token histogram
    gen_tokens: float | None = None
    gen_s: float | None = None
    gen_requests: float | None = None
    steps: float | None = None
    steps_s: float | None = None
    decoding: float | None = None
    engine: str | None = None
    slots: tuple[Slot, ...] | None = None
    #: With ``slots``: the balance of the finished-request counters not yet in a row (tokens, ms;
    #: :func:`detector.engines.llamacpp.slots_row`); ``None`` reads as nothing owed.
    slots_carry: tuple[float, float] | None = None

    def to_list(self) -> list[Any]:
        """The values in field order (how the scraper keeps the previous scrape; JSON-able)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[Any]) -> EngineCounters:
        """Inverse of :meth:`to_list`; a shorter list (an older layout) leaves the rest ``None``.
        ``ValueError`` / ``TypeError`` on a stored value of the wrong kind (the caller re-bases)."""
        names = [f.name for f in fields(cls)]
        kw = dict(zip(names, values, strict=False))
        for name in names[: names.index("engine")]:
            v = kw.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise TypeError(f"stored {name} is not a number")
        if kw.get("engine") is not None and kw["engine"] not in ENGINES:
            raise ValueError("stored engine unknown")
        if kw.get("slots") is not None:  # a slot of an older layout has no counted tokens and ms
            kw["slots"] = tuple((int(a), int(b), int(c), int(d), int(e), float(f))
                                for a, b, c, d, e, f in (list(slot) + [0, 0.0][len(slot) - 4:] for slot in kw["slots"]))
        carry = kw.get("slots_carry")
        if carry is not None:
            if (not isinstance(carry, list | tuple) or len(carry) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int | float) for v in carry)
                    or not all(abs(v) <= m for v, m in zip(carry, MAX_CARRY, strict=True))):
                raise ValueError("stored slots_carry is not a bounded (tokens, ms) pair")
            kw["slots_carry"] = (float(carry[0]), float(carry[1]))
        return cls(**kw)


def _trie(names: list[str]) -> str:
    """A regular expression matching exactly ``names``, as a trie (shared prefixes tried once)."""
    tree: dict = {}
    for name in names:
        node = tree
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")" if alts else ""
        return f"(?:{body})?" if "" in node and body else body

    return emit(tree)


# A sample line of one of our names: groups (name, labels, value token). The name must be followed by
# "{" or a space (a longer name that begins with one of ours is another series); the labels are from
# the "{" to the last "}" of the line (label values may hold "}" and spaces), "" without; the value
# is the first token after them. A "{" never closed leaves the token "{..." (not a number: an error,
# not a skipped line). _LINE finds the lines after a newline, _FIRST the page's first line.
_SAMPLE = (f"({_trie(sorted({n for n, _sel in _SELECTORS.values()}))})"
           r"(\{[^\n]*\}|(?=[{ ]))[^\S\n]*(\S*)")
_LINE, _FIRST = re.compile("\n" + _SAMPLE), re.compile(_SAMPLE)


def _samples(text: str) -> dict[str, list[tuple[str, str]]]:
    """The label text and value token of the names we read, ``name -> [(labels, token) of each
    line]`` (one pass)."""
    found: dict[str, list[tuple[str, str]]] = {}
    first = _FIRST.match(text)
    if first is not None:
        found[first[1]] = [(first[2], first[3])]
    for name, labels, token in _LINE.findall(text):
        found.setdefault(name, []).append((labels, token))
    return found


def _total(samples: dict[str, list[tuple[str, str]]], source: str) -> float | None:
    """The sum over label sets of the finite samples of ``source`` (a name, or ``name{label="v"}``:
    only the lines with that label), or ``None`` (none, or none finite; a line without a value is
    not a sample). ``ValueError`` on a value not a number."""
    name, selector = _SELECTORS.get(source) or _split(source)
    total, found = 0.0, False
    for labels, token in samples.get(name, ()):
        if not token or (selector is not None and not _has_label(labels, selector)):
            continue
        try:
            value = float(token)
        except ValueError as exc:
            raise ValueError(f"{name}: not a number: {token[:40]!r}") from exc
        if math.isfinite(value):
            total += value
            found = True
    if found and source in _SCALE:
        total *= _SCALE[source]
    return total if found else None


def _has_label(labels: str, selector: str) -> bool:
    """Whether the label text ``{a="x",b="y"}`` holds the pair ``selector`` (``b="y"``)."""
    at = labels.find(selector)
    while at > 0:
        if labels[at - 1] in "{," and labels[at + len(selector)] in ",}":
            return True
        at = labels.find(selector, at + 1)
    return False


def parse(text: str) -> EngineCounters | None:
    """The :class:`EngineCounters` of one ``/metrics`` page; ``None`` when no engine of
    :data:`ENGINES` wrote it (vLLM and SGLang: no inter-token histogram). Raises ``ValueError`` on a
    sample named here whose value is not a number (only the names a field is taken from are
    converted)."""
    samples = _samples(text)
    if not samples:
        return None
    values: dict[str, Any] = {}
    for sum_name, count_name in _ITL_PAIRS:
        s = _total(samples, sum_name) if sum_name in samples else None
        if s is not None:
            values.update(itl_sum_s=s, itl_count=_total(samples, count_name) or 0.0,
                          engine=sum_name.partition(":")[0])
            break
    else:
        engine = next((engine for engine, marks in _MARKS if not marks.isdisjoint(samples)), None)
        if engine is None:
            return None
        values["engine"] = engine
    for field_name, names in _OTHER_SOURCES:
        for name, sample in names:
            if sample in samples and (v := _total(samples, name)) is not None:
                values[field_name] = v
                break
    return EngineCounters(**values)


def _delta(prev: EngineCounters, cur: EngineCounters, name: str) -> float | None:
    """``cur - prev`` of a counter field; ``None`` when either lacks it or it went down (a reset)."""
    a, b = getattr(prev, name), getattr(cur, name)
    if a is None or b is None or b < a:
        return None
    return b - a


def _went_down(prev: EngineCounters, cur: EngineCounters, *names: str) -> bool:
    """Whether any of the counters ``names`` is lower now (the server restarted)."""
    return any((a := getattr(prev, n)) is not None and (b := getattr(cur, n)) is not None and b < a for n in names)


def _prefill(prev: EngineCounters, cur: EngineCounters) -> tuple[float | None, float | None]:
    """``(prefills, prefill_ms)`` of the interval, queue-free (see the module docstring)."""
    n, s = _delta(prev, cur, "prefill_count"), _delta(prev, cur, "prefill_sum_s")
    if n is not None and s is not None:
        return n, s * 1000.0
    n_t, s_t = _delta(prev, cur, "ttft_count"), _delta(prev, cur, "ttft_sum_s")
    n_q, s_q = _delta(prev, cur, "queue_count"), _delta(prev, cur, "queue_sum_s")
    if None in (n_t, s_t, n_q, s_q):
        return None, None
    if not n_t:
        return 0.0, 0.0
    mean_queue = s_q / n_q if n_q else 0.0  # type: ignore[operator]
    return n_t, max(s_t / n_t - mean_queue, 0.0) * n_t * 1000.0  # type: ignore[operator]


def _computed_tokens(prev: EngineCounters, cur: EngineCounters, prefills: float | None) -> float | None:
    """The uncached prompt tokens of the interval's prefills (see the module docstring)."""
    if prefills is None:
        return None
    computed, n = _delta(prev, cur, "computed_sum"), _delta(prev, cur, "computed_count")
    if computed is not None and n == prefills:
        return computed
    prompt = _delta(prev, cur, "prompt_sum")
    if prompt is None:
        return None
    queries, hits = _delta(prev, cur, "cache_queries"), _delta(prev, cur, "cache_hits")
    hit_ratio = min(hits / queries, 1.0) if queries and hits is not None else 0.0
    return prompt * (1.0 - hit_ratio)


def _step_decode(prev: EngineCounters, cur: EngineCounters, interval_ms: float) -> tuple[float, float] | None:
    """TGI's and Triton's ``(tokens, token_ms)``: the interval's engine steps times the streams each
    step advanced (see "Engines"); ``None`` after a reset."""
    steps, step_s = _delta(prev, cur, "steps"), _delta(prev, cur, "steps_s")
    if _went_down(prev, cur, "steps", "steps_s"):
        return None
    streams = cur.decoding or prev.decoding or 0.0
    if steps is None or step_s is None or streams <= 0:
        return 0.0, 0.0
    if steps > 0:
        return steps * streams, step_s * 1000.0 * streams
    if prev.decoding and cur.decoding:  # streams there at both scrapes, and no step between: stalled
        return 0.0, interval_ms * min(prev.decoding, cur.decoding)
    return 0.0, 0.0


def _finished_decode(prev: EngineCounters, cur: EngineCounters) -> tuple[float, float]:
    """llama.cpp's (without /slots) and trtllm's ``(tokens, token_ms)`` from the requests that ended
    in the interval; trtllm's decode time covers one token fewer than each request generated."""
    tokens, gen_s = _delta(prev, cur, "gen_tokens"), _delta(prev, cur, "gen_s")
    if tokens is None or gen_s is None:
        return 0.0, 0.0
    if cur.gen_requests is not None:
        requests = _delta(prev, cur, "gen_requests")
        tokens = tokens - requests if requests is not None else 0.0
    if tokens <= 0:
        return 0.0, 0.0
    return tokens, gen_s * 1000.0


def progress_row(node: str, prev: tuple[float, EngineCounters] | None, ts: float,
                 cur: EngineCounters) -> list | None:
    """The progress row of :func:`advance` alone (see there)."""
    return advance(node, prev, ts, cur)[0]


def advance(node: str, prev: tuple[float, EngineCounters] | None, ts: float,
            cur: EngineCounters) -> tuple[list | None, EngineCounters]:
    """``(row, keep)``: the progress row (:data:`ROW_FIELDS`) between the scrape ``prev = (ts,
    counters)`` and this one, and the counters to keep as the node's previous scrape (``cur``, with a
    llama.cpp snapshot's counted tokens carried: :func:`detector.engines.llamacpp.slots_row`). The row
    is ``None`` on the first scrape, when no time passed, or when the decode counters went down (a
    restart: the next scrape re-bases).

    A row whose tokens come from finished-request counters (llama.cpp without /slots, trtllm-serve)
    carries no ``running``: its tokens arrive when a request ends, so between two completions a busy
    node shows a running batch and no token, which on a live source means its streams stalled
    (:mod:`detector.inflight`). Without the gauge such a row is never read as a stall."""
    if prev is None:
        return None, cur
    prev_ts, before = prev
    interval = ts - prev_ts
    if not interval > 0:
        return None, cur
    interval_ms = interval * 1000.0
    running, prefill_work = cur.running, _delta(before, cur, "prompt_total")
    keep = cur
    if cur.itl_count is not None or cur.itl_sum_s is not None:  # vLLM, SGLang
        tokens, token_s = _delta(before, cur, "itl_count"), _delta(before, cur, "itl_sum_s")
        if tokens is None or token_s is None:
            return None, cur
        token_ms = token_s * 1000.0
        prefills, prefill_ms = _prefill(before, cur)
        prefill_tokens = _computed_tokens(before, cur, prefills)
    elif cur.engine == "llamacpp":
        if _went_down(before, cur, "prompt_total", "prompt_s", "gen_tokens", "gen_s"):
            return None, cur
        prefills = prefill_ms = prefill_tokens = None
        if cur.slots is not None and before.slots is not None:
            finished = _delta(before, cur, "gen_tokens"), _delta(before, cur, "gen_s")
            tokens, token_ms, prefills, prefill_ms, prefill_tokens, carried, carry = slots_row(
                before.slots, cur.slots, interval_ms, prefill_work, _delta(before, cur, "prompt_s"),
                None if None in finished else (finished[0], finished[1] * 1000.0),  # type: ignore[operator]
                before.slots_carry or (0.0, 0.0))
            keep = replace(cur, slots=carried, slots_carry=carry)
            running = float(len(cur.slots))
        elif cur.slots is None and before.slots is None:
            tokens, token_ms = _finished_decode(before, cur)
            running = None  # late tokens: see the docstring
        else:  # /slots read at one end only: the two decode sources must not count a token twice
            tokens, token_ms, running = 0.0, 0.0, None  # nothing to judge, and no stall
    elif cur.steps is not None or before.steps is not None:  # TGI, Triton
        decode = _step_decode(before, cur, interval_ms)
        if decode is None:
            return None, cur
        tokens, token_ms = decode
        prefills = prefill_ms = prefill_tokens = None
    else:  # trtllm-serve (or a page with no decode family)
        if _went_down(before, cur, "gen_tokens", "gen_s", "gen_requests"):
            return None, cur
        tokens, token_ms = _finished_decode(before, cur)
        running = None  # late tokens: see the docstring
        prefills, prefill_ms = _prefill(before, cur)
        prefill_tokens = _computed_tokens(before, cur, prefills)
        if cur.engine == "trtllm":
            prefill_work = prefill_tokens  # its prompt counter holds the cached tokens too
    return [node, ts, interval, tokens, token_ms, prefills, prefill_ms, prefill_tokens, running, prefill_work,
            cur.kv_usage, _delta(before, cur, "preemptions")], keep
