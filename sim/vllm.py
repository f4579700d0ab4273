"""One inference node as vLLM V1 schedules it: a step loop with continuous batching.

Each step (``vllm/v1/core/sched/scheduler.py``, FCFS):

1. every running sequence that is decoding gets one token (running requests are served first);
2. if the KV cache cannot hold those tokens, the *last* running sequence is preempted (V1 recomputes:
   its blocks are freed, it goes back to the front of the waiting queue and later prefills its prompt
   plus the tokens it had generated), repeatedly until they fit;
3. the remaining token budget (``max_num_batched_tokens - decodes``) goes to prefill chunks: first the
   running sequences still prefilling, in order, then waiting requests in arrival order while fewer than
   ``max_num_seqs`` run and the cache has room (chunked prefill: a prompt longer than the budget takes
   several steps);
4. the step takes :meth:`sim.profile.StepModel.step_ms` of its composition; every sequence
   of the node waits for it (one batch), the decoding ones each emit one token at its end, a sequence
   whose prefill completes emits its first token at its end. A node-wide stall (ECC replay, XID, a host
   hiccup) delays the next step; as in vLLM, a token's inter-token latency is the time since its
   stream's previous token, so the first token after a stall carries the gap in every stream.

The loop is exact but does not visit every step: while the batch does not change (no arrival, no
sequence finishing, no prefill chunk completing, no fault edge) the steps are identical, so a *phase*
of ``k`` equal steps is scheduled as one event, and anything that changes the batch cuts the phase at
the end of the step in progress. Counters advance in O(1) per phase (a decoding sequence's generated
count is ``gen0 + decode_steps - mark``), which keeps 64 nodes well above real time. Two deliberate
approximations: a phase is at most ``MAX_PHASE_STEPS`` long, and its steps all take the time of the
first (decode context grows by ``D`` tokens per step: at most ~1 % within a phase); KV usage is
counted in tokens (blocks are ``block_size`` tokens, so each sequence wastes on average half a block,
added as ``block_size/2`` per sequence when checking capacity). Step-to-step jitter is one lognormal
draw per phase (``step_jitter_cv``).

A client that gives up (timeout) aborts its request (vLLM's OpenAI server aborts on disconnect), which
frees its slot and cache at the next step boundary.

The node's ``/metrics`` (vLLM V1 names, :class:`sim.metrics.EngineMetrics`) are kept here;
``NodeEngine.m.render()`` is the full page (what the demo's nodes serve), :func:`scrape_page` the
lines of it that the control plane's parser reads (what the simulator scrapes, every tick per node).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.metrics import EngineMetrics
from sim.profile import Resources, StepModel

MAX_PHASE_STEPS = 32

# The samples of the full page that :func:`detector.engine_metrics.parse` reads (its ``_SOURCES`` names
# a vLLM V1 page has), with the values they show: the rest of the page (bucket lines, e2e latency,
# generation tokens, comments) is skipped by the parser and never changes what it returns, so the
# simulator renders these ~1 kB instead of ~14 kB, from one template. ``tests/sim/
# test_sim_step_engine.py`` checks that both pages parse to the same counters.
SCRAPED_SAMPLES = (
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
)


def _scrape_template(model_name: str) -> str:
    labels = f'engine="0",model_name="{model_name}"'  # as EngineMetrics.render labels every sample
    return "".join(f"{name}{{{labels}}} %r\n" for name in SCRAPED_SAMPLES)


_TEMPLATE = _scrape_template("llama")


def scrape_page(m: EngineMetrics) -> str:
    """The sample lines of ``m.render()`` that the control plane's parser reads (:data:`SCRAPED_SAMPLES`,
    in that order), value for value (``%r`` of a float is the ``repr`` the full page prints)."""
    h_itl, h_ttft, h_pf, h_q, h_pr = m.itl, m.ttft, m.prefill, m.queue, m.prompt
    return _TEMPLATE % (
        float(h_itl.sum), float(h_itl.total), float(h_ttft.sum), float(h_ttft.total), float(h_pf.sum),
        float(h_pf.total), float(h_q.sum), float(h_q.total), float(h_pr.sum), float(h_pr.total),
        float(m.running), float(m.waiting), float(m.kv_usage), float(m.prompt_tokens), float(m.cache_queries),
        float(m.cache_hits), float(m.preemptions))


@dataclass
class NodeSettings:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_capacity_tokens: int = 1_000_000
    step_jitter_cv: float = 0.02


class Seq:
    """One request on a node. ``need``: tokens to prefill before its next token (its prompt, plus what
    it had generated when it was preempted); ``gen0``/``mark``: generated tokens at decode step
    ``mark`` (while decoding, ``generated = gen0 + decode_steps - mark``)."""

    __slots__ = ("aborted", "arrival", "att", "comp", "computed", "decoding", "first_t", "gen0", "mark", "need",
                 "preempt_t", "prompt", "sched_t")

    def __init__(self, att: int, prompt: int, completion: int, now: float) -> None:
        self.att, self.prompt, self.comp = att, prompt, max(1, completion)
        self.need, self.computed, self.gen0, self.mark = prompt, 0, 0, 0
        self.arrival, self.sched_t, self.first_t, self.preempt_t = now, -1.0, -1.0, -1.0
        self.decoding = False
        self.aborted = False


class NodeEngine:
    """The scheduler and step clock of one node. Time in seconds.

    ``push(t, ver)`` schedules this node's next phase end; the owner calls :meth:`phase_end` when it
    fires with the current ``ver``. ``on_first_token(att, t)`` and ``on_finish(att, t)`` report
    sequences; ``on_admit(att, t)`` (first scheduling: an ECC replay may stall the node) and
    ``on_preempt(att, kv_tokens)`` (a swap over the host link may cost time) are optional hooks.
    ``state(now)`` returns ``(Resources, kv_capacity_fraction, step_multiplier)`` of the node's faults.
    """

    def __init__(self, model: StepModel, settings: NodeSettings, speed: float,
                 push: Callable[[float, int], None], on_first_token: Callable[[int, float], None],
                 on_finish: Callable[[int, float], None],
                 state: Callable[[float], tuple[Resources, float, float]],
                 jitter: Callable[[], float], on_admit: Callable[[int, float], None] | None = None,
                 on_preempt: Callable[[int, int], None] | None = None, keep_observations: bool = False) -> None:
        self.model, self.cfg, self.speed = model, settings, speed
        self.half_block = settings.block_size / 2.0  # a sequence's mean waste in its last block, tokens
        self.on_admit = on_admit or (lambda att, now: None)
        self.on_preempt = on_preempt or (lambda att, kv_tokens: None)
        self.push, self.on_first_token, self.on_finish, self.state, self.jitter = (
            push, on_first_token, on_finish, state, jitter)
        self.keep_observations = keep_observations
        self.observations: list[tuple[str, float]] = []  # (kind, value) when keep_observations (tests)
        self.m = EngineMetrics()
        self.ver = 0
        self.seqs: dict[int, Seq] = {}
        self.running: list[Seq] = []  # admission order (preemption takes the last)
        self.prefilling: list[Seq] = []
        self.n_decoding = 0
        self.waiting: deque[Seq] = deque()
        self.n_aborted = 0
        self.finish_heap: list[tuple[int, int, Seq]] = []
        self.decode_steps = 0
        self.kv_used = 0.0
        self.pending_stall = 0.0
        self.gap = 0.0  # a stall before the current phase's first step (in its tokens' inter-token time)
        self.served = 0
        # Current phase.
        self.active = False
        self.t0 = 0.0
        self.s = 0.0
        self.k = 0
        self.D = 0
        self.chunks: list[tuple[Seq, int]] = []
        self.cap = float(settings.kv_capacity_tokens)

    # -- inputs ---------------------------------------------------------------------------------
    def submit(self, att: int, prompt: int, completion: int, now: float) -> None:
        q = Seq(att, prompt, completion, now)
        self.seqs[att] = q
        self.waiting.append(q)
        self.interrupt(now)

    def abort(self, att: int, now: float) -> None:
        """The client went away: drop the request at the next step boundary."""
        q = self.seqs.get(att)
        if q is None:
            return
        if q.sched_t < 0 or q in self.waiting:
            self.waiting.remove(q)
            del self.seqs[att]
            return
        q.aborted = True
        self.n_aborted += 1
        self.interrupt(now)

    def stall(self, seconds: float, now: float) -> None:
        """A node-wide gap (ECC replay, XID, host hiccup): the next step starts ``seconds`` later."""
        self.pending_stall += seconds
        self.interrupt(now)

    def interrupt(self, now: float) -> None:
        """The batch must be re-planned: end the current phase at the end of the step in progress."""
        if not self.active:
            self.plan(now)
            return
        if now < self.t0:
            j = 0
        else:
            j = min(self.k, math.ceil((now - self.t0) / self.s - 1e-9)) if self.s > 0 else self.k
        if j < self.k:
            self.k = j
            self.ver += 1
            self.push(self.t0 + j * self.s, self.ver)

    def clear(self) -> list[int]:
        """Crash: every sequence is lost. Returns their attempt ids."""
        doomed = [q.att for q in self.running] + [q.att for q in self.waiting]
        self.seqs.clear()
        self.running.clear()
        self.prefilling.clear()
        self.waiting.clear()
        self.finish_heap.clear()
        self.n_decoding = self.n_aborted = 0
        self.kv_used = 0.0
        self.active = False
        self.ver += 1
        return doomed

    # -- the step loop ----------------------------------------------------------------------------
    def generated(self, q: Seq) -> int:
        return q.gen0 + self.decode_steps - q.mark if q.decoding else q.gen0

    def kv_len(self, q: Seq) -> int:
        return q.need + self.decode_steps - q.mark if q.decoding else q.computed

    def commit(self, j: int) -> None:
        """Account ``j`` steps of the current phase (no sequence completes inside a phase)."""
        if j <= 0:
            return
        D, s = self.D, self.s
        grow = D
        if D:
            self.decode_steps += j
            m = self.m
            if self.gap:
                # vLLM's inter-token latency is the time since the stream's previous token: the first
                # token after a node-wide stall carries the whole gap, for every stream at once.
                m.itl.observe(self.gap + s, D)
                if j > 1:
                    m.itl.observe(s, (j - 1) * D)
            else:
                m.itl.observe(s, j * D)
            m.generation_tokens += j * D
            if self.keep_observations:
                self.observations.append(("itl", s))
        for q, ch in self.chunks:
            q.computed += j * ch
            grow += ch
        self.m.prompt_tokens += j * (grow - D)  # vLLM counts prompt tokens per step, as computed
        self.kv_used += j * grow
        self.t0 += j * s
        self.k -= j
        self.gap = 0.0

    def progress_to(self, now: float) -> None:
        """Account the steps finished by ``now`` (for a scrape), leaving the phase's end in place."""
        if self.active and self.s > 0 and now > self.t0:
            j = min(self.k - 1, int((now - self.t0) / self.s + 1e-9))
            self.commit(j)

    def phase_end(self, now: float, ver: int) -> None:
        if ver != self.ver or not self.active:
            return
        self.commit(self.k)
        self.active = False
        m = self.m
        # Prefill chunks that completed: first token (or the next token after a recompute).
        for q, _ in self.chunks:
            if q.computed >= q.need and not q.aborted:
                self.prefilling.remove(q)
                if q.first_t < 0:
                    q.first_t = now
                    m.ttft.observe(now - q.arrival)
                    self.on_first_token(q.att, now)
                else:  # recomputed after a preemption: the stream resumes after the whole gap
                    m.itl.observe(now - q.preempt_t)
                q.gen0 += 1
                m.generation_tokens += 1
                q.need = q.computed
                if q.gen0 >= q.comp:
                    self._finish(q, now)
                else:
                    q.decoding = True
                    self.n_decoding += 1
                    q.mark = self.decode_steps
                    heapq.heappush(self.finish_heap, (self.decode_steps + q.comp - q.gen0, q.att, q))
        heap = self.finish_heap
        while heap and heap[0][0] <= self.decode_steps:
            q = heapq.heappop(heap)[2]
            if q.decoding and q.mark + q.comp - q.gen0 <= self.decode_steps:
                self._finish(q, now)
        self.plan(now)

    def _finish(self, q: Seq, now: float) -> None:
        m = self.m
        m.e2e.observe(now - q.arrival)
        m.prefill.observe(q.first_t - q.sched_t)
        m.prompt.observe(q.prompt)
        self.kv_used -= self.kv_len(q)
        if q.decoding:
            q.decoding = False
            self.n_decoding -= 1
        self.running.remove(q)
        del self.seqs[q.att]
        self.on_finish(q.att, now)

    def _drop(self, q: Seq) -> None:
        """Remove a running sequence (aborted or preempted) and free its cache."""
        self.kv_used -= self.kv_len(q)
        self.running.remove(q)
        if q.decoding:
            q.decoding = False
            self.n_decoding -= 1
        else:
            self.prefilling.remove(q)

    def _preempt(self, now: float) -> None:
        q = self.running[-1]
        g = self.generated(q)
        kv = self.kv_len(q)
        self._drop(q)
        q.gen0 = g
        q.need = q.prompt + g  # recompute: prompt plus what it had generated
        q.computed = 0
        q.preempt_t = now
        self.waiting.appendleft(q)
        self.m.preemptions += 1
        self.on_preempt(q.att, kv)

    def plan(self, now: float) -> None:
        """Compose the next step at ``now`` (a step boundary) and schedule the phase (module
        docstring, steps 1-4): aborted sequences leave, decodes that do not fit are preempted, the
        token budget goes to prefill chunks, and the phase's step time and length are set."""
        if self.n_aborted:
            for q in [q for q in self.running if q.aborted]:
                self._drop(q)
                del self.seqs[q.att]
            self.n_aborted = 0
        res, kv_frac, mult = self.state(now)
        cap = self.cap = self.cfg.kv_capacity_tokens * kv_frac
        self._fit_decodes(now, cap)
        D = self.n_decoding
        chunks, P, pf_ctx = self._prefill_chunks(now, cap, D)
        m = self.m
        m.running = len(self.running)
        m.waiting = len(self.waiting)
        m.kv_usage = min(1.0, max(0.0, self.kv_used / cap)) if cap > 0 else 1.0
        self.chunks = chunks
        if not D and not chunks:
            self.active = False  # (a request that fits no cache at all waits until its client gives up)
            return
        ms = self.model.step_ms(P + D, D, self.kv_used, pf_ctx, res)
        s = ms * self.speed * mult * self.jitter() / 1000.0
        k = self._phase_steps(cap, D, chunks, P)
        self.D, self.s, self.k = D, s, k
        self.t0 = now + self.pending_stall
        self.gap += self.pending_stall  # (a phase cut before its first step keeps its gap)
        self.pending_stall = 0.0
        self.active = True
        self.ver += 1
        self.push(self.t0 + k * s, self.ver)

    def _fit_decodes(self, now: float, cap: float) -> None:
        """Steps 1-2: every decoding sequence's next token must fit the cache (with half a block of
        waste per running sequence); while they do not, preempt the last running sequence."""
        half_block = self.half_block
        running = self.running
        while self.n_decoding and self.kv_used + self.n_decoding + half_block * len(running) > cap:
            self._preempt(now)

    def _prefill_chunks(self, now: float, cap: float, D: int) -> tuple[list[tuple[Seq, int]], int, float]:
        """Step 3: the token budget left by the ``D`` decodes, and the cache's room, go to prefill
        chunks: running prefills in order, then waiting requests (FCFS, admitted while fewer than
        ``max_num_seqs`` run). Returns the chunks ``(sequence, tokens)``, their tokens ``P`` and their
        summed attention context (tokens times the mean position of the chunk)."""
        cfg = self.cfg
        running = self.running
        half_block = self.half_block
        budget = cfg.max_num_batched_tokens - D
        free = cap - self.kv_used - D - half_block * len(running)
        chunks: list[tuple[Seq, int]] = []
        P = 0
        pf_ctx = 0.0
        for q in self.prefilling:
            if budget <= 0 or free < 1:
                break
            ch = int(min(q.need - q.computed, budget, free))
            if ch <= 0:
                break
            chunks.append((q, ch))
            P += ch
            pf_ctx += ch * (q.computed + ch / 2.0)
            budget -= ch
            free -= ch
        waiting = self.waiting
        while waiting and len(running) < cfg.max_num_seqs and budget > 0 and free > half_block:
            q = waiting[0]
            ch = int(min(q.need - q.computed, budget, free - half_block))
            if ch <= 0:
                break
            waiting.popleft()
            running.append(q)
            self.prefilling.append(q)
            if q.sched_t < 0:
                q.sched_t = now
                m = self.m
                m.queue.observe(now - q.arrival)
                m.cache_queries += q.prompt
                self.served += 1
                self.on_admit(q.att, now)
            chunks.append((q, ch))
            P += ch
            pf_ctx += ch * (q.computed + ch / 2.0)
            budget -= ch
            free -= ch + half_block
        return chunks, P, pf_ctx

    def _phase_steps(self, cap: float, D: int, chunks: list[tuple[Seq, int]], P: int) -> int:
        """Step 4's phase length: how many identical steps follow before the batch changes, at most
        :data:`MAX_PHASE_STEPS`: until the first decoding sequence finishes, one step when several
        prefill chunks run (or until a lone chunk's prompt is done), and no more steps than the
        cache has room for at ``D + P`` tokens a step."""
        k = MAX_PHASE_STEPS
        if D:
            heap = self.finish_heap
            while heap:
                q = heap[0][2]
                if q.decoding and q.mark + q.comp - q.gen0 == heap[0][0]:
                    break
                heapq.heappop(heap)  # stale: preempted, aborted or finished
            if heap:
                k = min(k, max(1, heap[0][0] - self.decode_steps))
        if chunks:
            if len(chunks) > 1:
                k = 1
            else:
                q, ch = chunks[0]
                k = min(k, max(1, (q.need - q.computed) // ch))
        grow = D + P
        if grow and k > 1:
            room = cap - self.kv_used - self.half_block * len(self.running)
            k = min(k, max(1, int(room // grow)))
        return k
