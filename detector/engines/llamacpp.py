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

The page is untrusted: :func:`slots_from_json` refuses a document that is not a list of slot
objects, has more than :data:`MAX_SLOTS` slots or duplicate ids, or a count outside its bound
(:class:`SlotsError`, with the reason). Pure (stdlib only).
"""

from __future__ import annotations

import json
from typing import Any

#: One processing slot: ``(slot id, id_task, n_decoded, n_prompt_tokens_processed)``.
Slot = tuple[int, int, int, int]

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
        out.append((sid, task, decoded, prompt))
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


def slots_row(before: tuple[Slot, ...], now: tuple[Slot, ...], interval_ms: float, prompt_tokens: float | None,
              prompt_s: float | None) -> tuple[float, float, float | None, float | None, float | None]:
    """``(tokens, token_ms, prefills, prefill_ms, prefill_tokens)`` between two snapshots.

    Decode: see the module docstring. Prefill: ``prompt_tokens`` and ``prompt_s`` are the interval's
    deltas of ``llamacpp:prompt_tokens_total`` / ``prompt_seconds_total`` (``None``: unknown). The
    tasks that finished their prompt in the interval as /slots shows them (generating now, and new or
    still in their prompt at the earlier snapshot) are the prefills when their
    ``n_prompt_tokens_processed`` add up to the counter's delta: then the counters' time is exactly
    theirs. Otherwise (a request that began and ended between two scrapes, or a prompt that finished
    between the /slots and the /metrics read) the prefill columns are ``None``: a count that does not
    match the time would make every prefill of the row look slow or fast."""
    prev = {(sid, task): decoded for sid, task, decoded, _prompt in before}
    tokens, token_ms, done, done_tokens = 0, 0.0, 0, 0
    for sid, task, decoded, prompt in now:
        was = prev.get((sid, task))
        if was is not None and was >= 1:  # generating at both ends: a whole interval of its stream
            if decoded >= was:  # lower: not the same task (a restart reused the id), adds nothing
                tokens += decoded - was
                token_ms += interval_ms
        elif decoded >= 1:  # its prompt finished during the interval
            done += 1
            done_tokens += prompt
    if prompt_tokens is None or prompt_s is None or done_tokens != prompt_tokens:
        return float(tokens), token_ms, None, None, None
    return float(tokens), token_ms, float(done), prompt_s * 1000.0, float(done_tokens)
