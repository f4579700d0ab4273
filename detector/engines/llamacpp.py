"""llama.cpp server's ``GET /slots``: the live decode signal its ``/metrics`` page lacks.

llama.cpp's ``llamacpp:*`` counters move only when a prompt is done and when a request ends
(:mod:`detector.engine_metrics`, "Engines"). ``/slots`` (on unless the server runs with
``--no-slots``, which answers 501) lists the server's slots; a slot that is processing a task shows
``id``, ``id_task``, ``n_prompt_tokens_processed`` (grows while the prompt is evaluated, excludes
cache hits: what ``llamacpp:prompt_tokens_total`` adds when the prompt is done) and
``next_token[0].n_decoded`` (tokens generated so far; the first one is sampled at the end of the
prompt, so ``n_decoded >= 1`` is "prompt done"). An idle slot shows ``is_processing: false`` (and,
once it has served a task, that task's stale fields, which are not read). Older servers wrote
``state`` (0 = idle) and a ``next_token`` object instead of a list; both are read.

A snapshot is kept as a tuple of :data:`Slot` (processing slots only, by slot id): small enough to
store with the node's previous counters. Between two snapshots (:func:`slots_row`), every slot
processing the **same** task at both that had already started generating at the earlier one adds
its Δ``n_decoded`` tokens and the whole interval's ms: its stream was decoding (or stalled) for the
whole interval, so ``token_ms / tokens`` is ms per token per stream and ``token_ms / interval_ms``
the number of decoding streams, as with vLLM's inter-token histogram. A slot that made no progress
adds its ms with 0 tokens (a stalled node: a censored observation, not nothing). A slot whose task
changed, ended, or was still in its prompt adds nothing to decode: a partly covered interval
would mix prefill into the per-token time.

**The rest of each request from the counters, counted once.** A healthy request often decodes in
less than two scrape periods (40 tokens at 12 ms is half a second): /slots then never sees it
generating at two snapshots and it would give no decode at all, so a fast node would have almost no
samples and a slow one (whose requests last) many. The finished-request counters
(``llamacpp:tokens_predicted_total`` / ``tokens_predicted_seconds_total``) hold every request's whole
decode when it ends. Each slot of a snapshot carries what the rows already counted of its task
(``counted_tokens``, ``counted_ms``); when tasks end, the counters' delta less what was counted of them
is the rest: the requests /slots never saw decoding, and the ends of the others. It joins the row, so
every token is counted once: live while the request runs, the remainder when it ends.

**A balance, never clipped.** The two reads of a scrape are not one instant: ``/metrics`` is read,
then ``/slots``. A request that ends between the two is gone from the snapshot while the counters do
not hold it yet; the rest of that interval is then negative (what the rows counted of it, less
nothing), and dropping it would count the request's live part again when the counters show its end
at the next scrape (seen on a real server: 127 tokens for two requests of 48). The rest is kept as a
signed balance (``carry``, tokens and ms) and the row takes it only when both are positive: summed
over the scrapes, every token is counted exactly once whatever the order of the reads, only its
interval may be the next one. A restart (the counters go down) starts a fresh balance.

The page is untrusted: :func:`slots_from_json` refuses a document that is not a list of slot
objects, has more than :data:`MAX_SLOTS` slots or duplicate ids, or a count outside its bound
(:class:`SlotsError`, with the reason). Pure (stdlib only).
"""

from __future__ import annotations

import json
from typing import Any

#: One processing slot: ``(slot id, id_task, n_decoded, n_prompt_tokens_processed, counted_tokens,
#: counted_ms)``; the last two: what the rows have counted of its task so far (0 in a fresh read).
Slot = tuple[int, int, int, int, int, float]

#: More slots than any server runs (``--parallel``; each holds a KV-cache share): a larger list is
#: not a llama.cpp server's, and the snapshot is stored per node.
MAX_SLOTS = 1024
#: Slot ids are small indexes; task ids count requests since the server started (a 64-bit counter
#: would take centuries at 10^6 requests/s to pass 2^53, the largest exact float).
MAX_SLOT_ID = MAX_SLOTS * 64
MAX_TASK_ID = 2**53
#: Tokens one slot can hold (prompt + generated): above any context window (10^7 tokens).
MAX_SLOT_TOKENS = 10_000_000


class SlotsError(ValueError):
    """A ``/slots`` document refused, with the reason."""


def _count(obj: dict[str, Any], key: str, limit: int, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlotsError(f"{where}: {key} is not an integer")
    if not 0 <= value <= limit:
        raise SlotsError(f"{where}: {key} {value} outside 0..{limit}")
    return value


def slots_from_json(data: Any) -> tuple[Slot, ...]:
    """The processing slots of a decoded ``/slots`` document, by slot id; :class:`SlotsError` on a
    document refused (see the module docstring)."""
    if not isinstance(data, list):
        raise SlotsError(f"not a list of slots but {type(data).__name__}")
    if len(data) > MAX_SLOTS:
        raise SlotsError(f"{len(data)} slots, more than {MAX_SLOTS}")
    out: list[Slot] = []
    seen: set[int] = set()
    for i, slot in enumerate(data):
        if not isinstance(slot, dict):
            raise SlotsError(f"slot {i} is not an object")
        sid = _count(slot, "id", MAX_SLOT_ID, f"slot {i}")
        if sid in seen:
            raise SlotsError(f"slot id {sid} twice")
        seen.add(sid)
        processing = slot.get("is_processing")
        if processing is None and "state" in slot:  # older servers: state 0 = idle
            state = slot["state"]
            processing = state != 0 if isinstance(state, int) and not isinstance(state, bool) else None
        if not isinstance(processing, bool):
            raise SlotsError(f"slot {sid}: is_processing is not a boolean")
        if not processing:
            continue
        task = _count(slot, "id_task", MAX_TASK_ID, f"slot {sid}")
        prompt = _count(slot, "n_prompt_tokens_processed", MAX_SLOT_TOKENS, f"slot {sid}")
        nxt = slot.get("next_token")
        if isinstance(nxt, list) and nxt:
            nxt = nxt[0]
        if not isinstance(nxt, dict):
            raise SlotsError(f"slot {sid}: next_token is not an object or a list of them")
        decoded = _count(nxt, "n_decoded", MAX_SLOT_TOKENS, f"slot {sid}")
        out.append((sid, task, decoded, prompt, 0, 0.0))
    out.sort()
    return tuple(out)


def parse_slots(text: str | bytes) -> tuple[Slot, ...]:
    """:func:`slots_from_json` of a ``/slots`` body; :class:`SlotsError` when it is not JSON. (The
    scraper decodes with orjson and calls :func:`slots_from_json`; the size cap is the caller's.)"""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlotsError(f"not JSON: {str(exc)[:80]}") from None
    return slots_from_json(data)


#: Neither part of a balance (tokens, ms) grows past what a full server could owe: every slot's
#: whole context, at an hour a token. A larger one is a page that lies; the balance starts afresh.
MAX_CARRY = (float(MAX_SLOTS * MAX_SLOT_TOKENS), float(MAX_SLOTS * MAX_SLOT_TOKENS) * 3.6e6)


def slots_row(before: tuple[Slot, ...], now: tuple[Slot, ...], interval_ms: float, prompt_tokens: float | None,
              prompt_s: float | None, finished: tuple[float, float] | None = None,
              carry: tuple[float, float] = (0.0, 0.0),
              ) -> tuple[float, float, float | None, float | None, float | None, tuple[Slot, ...], tuple[float, float]]:
    """``(tokens, token_ms, prefills, prefill_ms, prefill_tokens, now', carry')`` between two
    snapshots; ``now'`` is ``now`` with each slot's counted tokens and ms carried (keep it as the next
    ``before``), ``carry'`` the balance of the finished counters not yet in a row (keep it too).

    Decode: see the module docstring; ``finished`` is the interval's ``(Δtokens, Δms)`` of the
    finished-request counters (``None``: unknown, the rest of ended requests is then not counted),
    ``carry`` the balance the previous row left.
    Prefill: ``prompt_tokens`` and ``prompt_s`` are the interval's deltas of
    ``llamacpp:prompt_tokens_total`` / ``prompt_seconds_total`` (``None``: unknown). The tasks that
    finished their prompt in the interval as /slots shows them (generating now, and new or still in
    their prompt at the earlier snapshot) are the prefills when their ``n_prompt_tokens_processed``
    add up to the counter's delta: then the counters' time is exactly theirs. Otherwise (a request
    that began and ended between two scrapes, or a prompt that finished between the /slots and the
    /metrics read) the prefill columns are ``None``: a count that does not match the time would make
    every prefill of the row look slow or fast."""
    prev = {(sid, task): (decoded, c_tokens, c_ms) for sid, task, decoded, _p, c_tokens, c_ms in before}
    tokens, token_ms, done, done_tokens = 0, 0.0, 0, 0
    carried: list[Slot] = []
    for sid, task, decoded, prompt, *_ in now:
        was = prev.pop((sid, task), None)
        c_tokens, c_ms = 0, 0.0
        if was is not None and was[0] >= 1:  # generating at both ends: a whole interval of its stream
            if decoded >= was[0]:  # lower: not the same task (a restart reused the id), adds nothing
                tokens += decoded - was[0]
                token_ms += interval_ms
                c_tokens, c_ms = was[1] + decoded - was[0], was[2] + interval_ms
        elif decoded >= 1:  # its prompt finished during the interval
            done += 1
            done_tokens += prompt
        carried.append((sid, task, decoded, prompt, c_tokens, c_ms))
    if finished is not None:
        # The tasks left in `prev` ended: the counters hold their whole decode (or will, at the next
        # scrape, when one ended between the /metrics and the /slots read), the rows had part of it.
        rest_tokens = carry[0] + finished[0] - sum(c_tokens for _d, c_tokens, _m in prev.values())
        rest_ms = carry[1] + finished[1] - sum(c_ms for _d, _t, c_ms in prev.values())
        if rest_tokens > 0 and rest_ms > 0:
            tokens += rest_tokens
            token_ms += rest_ms
            carry = (0.0, 0.0)
        elif abs(rest_tokens) <= MAX_CARRY[0] and abs(rest_ms) <= MAX_CARRY[1]:
            carry = (float(rest_tokens), float(rest_ms))
        else:
            carry = (0.0, 0.0)
    out = tuple(carried)
    if prompt_tokens is None or prompt_s is None or done_tokens != prompt_tokens:
        return float(tokens), token_ms, None, None, None, out, carry
    return float(tokens), token_ms, float(done), prompt_s * 1000.0, float(done_tokens), out, carry
