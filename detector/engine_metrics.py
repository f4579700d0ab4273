"""A model server's own ``/metrics`` -> the streamed progress rows the detector reads.

An access-log line arrives when a request ends, and its TTFT includes the wait for a batch slot. The
model server measures what we need as it happens, without the queue, in Prometheus histograms and
counters. Between two scrapes of one node, the deltas of their cumulative values give one **progress
row** (:data:`ROW_FIELDS`)::

    [node, ts, interval_s, tokens, token_ms, prefills, prefill_ms, prefill_tokens, running, prefill_work,
     kv_usage]

- ``tokens``, ``token_ms``: Δcount and 1000·Δsum of the inter-token histogram (vLLM V1
  ``vllm:inter_token_latency_seconds``, V0 ``vllm:time_per_output_token_seconds``, SGLang
  ``sglang:inter_token_latency_seconds``): the decode signal, ``token_ms / tokens`` ms per token.
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

Columns a server does not expose are ``None``. A counter that went down (a server restart) gives no
row: the next scrape re-bases. All label sets of a family (one per served model) are summed.

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
from dataclasses import dataclass, fields

#: The layout of a progress row; rows of 5 (decode only, written before the prefill columns existed)
#: are still read, their missing columns ``None``.
ROW_FIELDS: tuple[str, ...] = (
    "node", "ts", "interval_s", "tokens", "token_ms", "prefills", "prefill_ms", "prefill_tokens", "running",
    "prefill_work", "kv_usage",
)

# Each field: the sample names that give it, first found wins (current name first, then older ones and
# other servers). A histogram field names its ``_sum`` or ``_count`` sample.
_SOURCES: dict[str, tuple[str, ...]] = {
    "itl_sum_s": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum",
                  "sglang:inter_token_latency_seconds_sum"),
    "itl_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
                  "sglang:inter_token_latency_seconds_count"),
    "prefill_sum_s": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_count": ("vllm:request_prefill_time_seconds_count",),
    "queue_sum_s": ("vllm:request_queue_time_seconds_sum", "sglang:queue_time_seconds_sum"),
    "queue_count": ("vllm:request_queue_time_seconds_count", "sglang:queue_time_seconds_count"),
    "ttft_sum_s": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"),
    "prompt_sum": ("vllm:request_prompt_tokens_sum", "sglang:prompt_tokens_histogram_sum"),
    "prompt_count": ("vllm:request_prompt_tokens_count", "sglang:prompt_tokens_histogram_count"),
    "computed_sum": ("vllm:request_prefill_kv_computed_tokens_sum",),
    "computed_count": ("vllm:request_prefill_kv_computed_tokens_count",),
    "cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                      "sglang:prompt_tokens_total"),
    "cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
                   "sglang:cached_tokens_total"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
}
# The inter-token family must be one server's pair (a page mixing V0 and V1 series reports both).
_ITL_PAIRS = tuple(zip(_SOURCES["itl_sum_s"], _SOURCES["itl_count"], strict=True))
_OTHER_SOURCES = tuple((f, names) for f, names in _SOURCES.items() if f not in ("itl_sum_s", "itl_count"))


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """The cumulative values of one scrape (gauges: the current value); ``None``: not exposed."""

    itl_sum_s: float
    itl_count: float
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

    def to_list(self) -> list[float | None]:
        """The values in field order (how the scraper keeps the previous scrape)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float | None]) -> EngineCounters:
        """Inverse of :meth:`to_list`; a shorter list (an older layout) leaves the rest ``None``."""
        names = [f.name for f in fields(cls)]
        return cls(**dict(zip(names, values, strict=False)))


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


# A sample line of one of our names: groups (name, value token). The name must be followed by "{" or
# a space (a longer name that begins with one of ours is another series); the value is the first
# token after the last "}" of the line (label values may hold "}" and spaces), or after the name.
# A "{" never closed leaves the token "{..." (not a number: an error, not a skipped line). _LINE finds
# the lines after a newline, _FIRST the page's first line.
_SAMPLE = (f"({_trie(sorted({n for names in _SOURCES.values() for n in names}))})"
           r"(?:\{[^\n]*\}|(?=[{ ]))[^\S\n]*(\S*)")
_LINE, _FIRST = re.compile("\n" + _SAMPLE), re.compile(_SAMPLE)


def _samples(text: str) -> dict[str, list[str]]:
    """The value tokens of the names we read, ``name -> [token of each line]`` (one pass)."""
    found: dict[str, list[str]] = {}
    first = _FIRST.match(text)
    if first is not None:
        found[first[1]] = [first[2]]
    for name, token in _LINE.findall(text):
        found.setdefault(name, []).append(token)
    return found


def _total(samples: dict[str, list[str]], name: str) -> float | None:
    """The sum over label sets of the finite samples named ``name``, or ``None`` (none, or none
    finite; a line without a value is not a sample). ``ValueError`` on a value not a number."""
    total, found = 0.0, False
    for token in samples.get(name, ()):
        if not token:
            continue
        try:
            value = float(token)
        except ValueError as exc:
            raise ValueError(f"{name}: not a number: {token[:40]!r}") from exc
        if math.isfinite(value):
            total += value
            found = True
    return total if found else None


def _sample_total(text: str, name: str) -> float | None:
    """The sum over label sets of the samples named exactly ``name`` (at a line start), or ``None``."""
    return _total(_samples(text), name)


def parse(text: str) -> EngineCounters | None:
    """The :class:`EngineCounters` of one ``/metrics`` page; ``None`` when it has no inter-token
    histogram (the one family a row cannot do without). Raises ``ValueError`` on a sample named here
    whose value is not a number (only the names a field is taken from are converted)."""
    samples = _samples(text)
    if not samples:
        return None
    itl = None
    for sum_name, count_name in _ITL_PAIRS:
        s = _total(samples, sum_name) if sum_name in samples else None
        if s is not None:
            itl = (s, _total(samples, count_name) or 0.0)
            break
    if itl is None:
        return None
    values: dict[str, float | None] = {"itl_sum_s": itl[0], "itl_count": itl[1]}
    for field_name, names in _OTHER_SOURCES:
        for name in names:
            if name in samples and (v := _total(samples, name)) is not None:
                values[field_name] = v
                break
    return EngineCounters(**values)  # type: ignore[arg-type]


def _delta(prev: EngineCounters, cur: EngineCounters, name: str) -> float | None:
    """``cur - prev`` of a counter field; ``None`` when either lacks it or it went down (a reset)."""
    a, b = getattr(prev, name), getattr(cur, name)
    if a is None or b is None or b < a:
        return None
    return b - a


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


def progress_row(node: str, prev: tuple[float, EngineCounters] | None, ts: float,
                 cur: EngineCounters) -> list | None:
    """The progress row (:data:`ROW_FIELDS`) between the scrape ``prev = (ts, counters)`` and this one;
    ``None`` on the first scrape, when no time passed, or when the inter-token counters went down."""
    if prev is None:
        return None
    prev_ts, before = prev
    interval = ts - prev_ts
    tokens, token_s = _delta(before, cur, "itl_count"), _delta(before, cur, "itl_sum_s")
    if not interval > 0 or tokens is None or token_s is None:
        return None
    prefills, prefill_ms = _prefill(before, cur)
    return [node, ts, interval, tokens, token_s * 1000.0, prefills, prefill_ms,
            _computed_tokens(before, cur, prefills), cur.running, _delta(before, cur, "prompt_total"), cur.kv_usage]
