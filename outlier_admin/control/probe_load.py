"""How much a canary probe sends: the load of the node's healthy peers, so that the probe is judged
against what they do under the same load.

**Why.** A quarantined or probing node gets no traffic (``detector.states.TRAFFIC``: DRAIN), so one
probe request runs alone on an idle engine. The detector judges it on ``norm`` — its latency over the
group's cost model, fitted on the peers' requests, against the peers' ``norm`` baseline — and the
peers serve theirs in full batches. On a continuous-batching engine a step over a batch of 36
requests of ~1,000 prompt tokens takes several times as long as a step over one short request, so an
idle node several times slower per step still answers faster than a healthy loaded one. Measured
on the simulator's vLLM step engine (an A100 group of the demo, 16 req/s over 6 of 8 nodes, the peers
running 31 to 60 requests): a node with the demo's PCIe fault (decode 2.5x, prefill 1.5x slower),
out of rotation, answered the canary's 10+32-token probe at ``norm`` 0.70 against a pass limit of
1.12 (a loaded healthy peer: 0.60 to 3.15) — it passed every probe, as in the demo. Sent as a batch of
36 requests of the peers' median size (1,000 prompt + 180 completion tokens), its median request read
1.60 (limit 1.03) and a healthy idle node's 0.84: the judge is right once the load is.

**What.** :func:`peer_load` reads the load off the group's detector (the snapshot the tick keeps in
Redis): the median running batch of the nodes in service that report one (their model servers'
``running`` gauge, from the scrapes) and the median prompt and completion of the healthy requests
the cost model is fitted on. A probe sends that many requests at once, each with its own prompt of
that many tokens (:func:`prompt_of`: distinct from the first token, so a prefix cache cannot serve
them), and the probe is the median answer (:func:`median_answer`). Without a reported batch (a fleet
with access logs only) the probe is one request, as before; the bounds :data:`MAX_CONCURRENCY`,
:data:`MAX_PROMPT_TOKENS` and :data:`MAX_COMPLETION_TOKENS` keep a probe's cost bounded whatever the
peers do. The node is out of service while it is probed: the load costs no user anything.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from detector.group import GroupDetector
from detector.moves import lookup
from detector.states import BASELINE_STATES

#: The most requests one probe sends at once (a peer batch beyond it is probed at this batch).
MAX_CONCURRENCY = 64
#: The longest prompt and completion of one probe request, in tokens.
MAX_PROMPT_TOKENS = 8192
MAX_COMPLETION_TOKENS = 1024
_IN_SERVICE = lookup(BASELINE_STATES)
#: Filler words of a probe prompt, about one token each in the tokenizers of the models we serve.
_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]


@dataclass(frozen=True)
class ProbeLoad:
    """``concurrency`` requests at once, each of about ``prompt_tokens`` prompt tokens (None: the
    canary's short prompt) and ``completion_tokens`` (None: ``CANARY_MAX_TOKENS``)."""

    concurrency: int = 1
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def peer_load(gd: GroupDetector) -> ProbeLoad:
    """The load of ``gd``'s nodes in service (see the module docstring), within the bounds."""
    a = gd.a
    running = a.running[_IN_SERVICE[a.state] & np.isfinite(a.running) & (a.running > 0)]
    if not running.size:
        return ProbeLoad()
    concurrency = int(min(max(round(float(np.median(running))), 1), MAX_CONCURRENCY))
    rows = gd.signals.reservoir.rows()
    prompt, completion = rows["p"], rows["c"]
    prompt, completion = prompt[np.isfinite(prompt) & (prompt > 0)], completion[np.isfinite(completion) & (completion > 0)]
    return ProbeLoad(
        concurrency,
        int(min(max(round(float(np.median(prompt))), 1), MAX_PROMPT_TOKENS)) if prompt.size else None,
        int(min(max(round(float(np.median(completion))), 1), MAX_COMPLETION_TOKENS)) if completion.size else None,
    )


def load_of(raw: bytes | None) -> ProbeLoad:
    """:func:`peer_load` of a detector snapshot (the tick's ``detector`` checkpoint); one request
    when there is none or it does not restore (a snapshot of another version is the tick's to mend)."""
    if not raw:
        return ProbeLoad()
    try:
        return peer_load(GroupDetector.from_bytes(raw))
    except Exception:
        return ProbeLoad()


def prompt_of(base: str, tokens: int | None, k: int, nonce: str | None = None) -> str:
    """Request ``k``'s prompt of a probe: ``base`` alone (``tokens`` None), else about ``tokens``
    words starting with the probe's ``nonce`` and ``k`` (no two requests share a first token, so a
    prefix cache serves none of them) and ending with ``base``."""
    if tokens is None:
        return base
    nonce = nonce or secrets.token_hex(4)
    head = f"probe {nonce}-{k}:"
    fill = max(tokens - len(head.split()) - len(base.split()), 0)
    words = (_WORDS[(k + i) % len(_WORDS)] for i in range(fill))
    return " ".join([head, *words, base])


def median_answer(answers: list[Any], total_of: Any) -> Any:
    """The answer with the median total time (the upper median of an even count): one request of
    the batch that stands for it. ``answers`` are all successful."""
    ordered = sorted(answers, key=total_of)
    return ordered[len(ordered) // 2]
