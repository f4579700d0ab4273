"""A simulated node's ``/metrics`` page, as vLLM V1 exposes it (Prometheus text format 0.0.4).

Families (vLLM V1 ``vllm/v1/metrics/loggers.py`` names; one label set ``model_name``):

- histograms ``vllm:inter_token_latency_seconds``, ``vllm:time_to_first_token_seconds``,
  ``vllm:request_prefill_time_seconds`` (first scheduling -> first token), ``vllm:request_queue_time_seconds``
  (arrival -> first scheduling), ``vllm:e2e_request_latency_seconds``, ``vllm:request_prompt_tokens``
  (observed when a request finishes, like the prefill time), with vLLM's bucket edges;
- counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens; the simulated engine
  has no prefix cache, so hits stay 0), ``vllm:num_preemptions_total``;
- gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``.

The simulator renders this text at every scrape and reads it back with the control plane's own parser
(:func:`detector.engine_metrics.parse`, :func:`detector.engine_metrics.progress_row`), so the detector
gets exactly what production would compute from the same page.
"""

from __future__ import annotations

from bisect import bisect_left

# vLLM V1's bucket edges (seconds; tokens for the prompt histogram: 1-2-5 up to the model length).
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
PROMPT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)


class Histogram:
    """Bucket counts, a sum and a count; ``observe(v, n)`` adds ``n`` samples of ``v``. The rendered
    lines are cached until the next observation (a scrape every 200 ms mostly finds the request
    histograms unchanged)."""

    __slots__ = ("_cache", "_prefix", "counts", "edges", "sum", "total")

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)
        self.sum = 0.0
        self.total = 0
        self._cache: tuple[int, float, str] | None = None
        self._prefix: tuple[str, ...] = ()

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect_left(self.edges, v)] += n
        self.sum += v * n
        self.total += n

    def text(self, name: str, labels: str) -> str:
        """The family's ``_bucket`` (cumulative), ``_sum`` and ``_count`` lines."""
        c = self._cache
        if c is not None and c[0] == self.total and c[1] == self.sum:
            return c[2]
        if not self._prefix:
            self._prefix = (*(f'{name}_bucket{{{labels},le="{float(e)}"}} ' for e in self.edges),
                            f'{name}_bucket{{{labels},le="+Inf"}} ')
        out = []
        acc = 0
        for prefix, k in zip(self._prefix, self.counts, strict=True):
            acc += k
            out.append(f"{prefix}{float(acc)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {float(self.total)}")
        text = "\n".join(out)
        self._cache = (self.total, self.sum, text)
        return text


class EngineMetrics:
    """The histograms, counters and gauges one simulated node exposes."""

    HISTOGRAMS = (
        ("vllm:inter_token_latency_seconds", "itl", ITL_BUCKETS, "Histogram of inter-token latency in seconds."),
        ("vllm:time_to_first_token_seconds", "ttft", TTFT_BUCKETS, "Histogram of time to first token in seconds."),
        ("vllm:request_prefill_time_seconds", "prefill", REQUEST_BUCKETS,
         "Histogram of time spent in PREFILL phase for request."),
        ("vllm:request_queue_time_seconds", "queue", REQUEST_BUCKETS,
         "Histogram of time spent in WAITING phase for request."),
        ("vllm:e2e_request_latency_seconds", "e2e", REQUEST_BUCKETS, "Histogram of e2e request latency in seconds."),
        ("vllm:request_prompt_tokens", "prompt", PROMPT_BUCKETS, "Number of prefill tokens processed."),
    )

    def __init__(self) -> None:
        self.itl = Histogram(ITL_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.prefill = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.prompt = Histogram(PROMPT_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cache_queries = 0
        self.cache_hits = 0
        self.preemptions = 0
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0

    def render(self, model_name: str = "llama") -> str:
        """The exposition text (what ``GET /metrics`` returns)."""
        labels = f'engine="0",model_name="{model_name}"'
        out: list[str] = []
        for name, attr, _, help_text in self.HISTOGRAMS:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} histogram")
            out.append(getattr(self, attr).text(name, labels))
        for name, value, kind, help_text in (
            ("vllm:num_requests_running", self.running, "gauge", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", self.waiting, "gauge", "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", self.kv_usage, "gauge", "KV-cache usage. 1 means 100 percent usage."),
            ("vllm:prompt_tokens_total", self.prompt_tokens, "counter", "Number of prefill tokens processed."),
            ("vllm:generation_tokens_total", self.generation_tokens, "counter",
             "Number of generation tokens processed."),
            ("vllm:prefix_cache_queries_total", self.cache_queries, "counter",
             "Prefix cache queries, in terms of number of queried tokens."),
            ("vllm:prefix_cache_hits_total", self.cache_hits, "counter",
             "Prefix cache hits, in terms of number of cached tokens."),
            ("vllm:num_preemptions_total", self.preemptions, "counter", "Cumulative number of preemption."),
        ):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{labels}}} {float(value)!r}")
        return "\n".join(out) + "\n"
