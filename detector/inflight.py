"""Evidence before a request ends: a node's in-flight streams that make no progress, as censored samples.

A completed request reports its latency when it ends: on a node whose every step became 10x slower,
a 2 s request reports 20 s later, and until then the node looks as healthy as its last request. A
progress row (:mod:`detector.engine_metrics`) says what the node's streams did *during* an interval.
A row with **no token** although streams were decoding is not "no data": it says that each of those
streams has waited at least ``L`` for its next token, ``L`` the time since the stall began. That is a
*right-censored* observation of the per-token time: the true value is ``> L``, not ``L``.

**What is a stalled row.** ``tokens == 0`` and either

- ``token_ms > 0``: the source counted streams that were decoding over the interval and saw none of
  them advance (llama.cpp's ``/slots``: a slot on the same task whose ``n_decoded`` did not move), or
- ``running > 0`` and the node was decoding right before (its previous row had tokens, or was stalled
  already): an inter-token histogram (vLLM, SGLang) observes a gap only when the next token comes, so
  a stalled vLLM node shows a running batch and an unmoving count. A running request that has not
  decoded yet (in its prefill) is not a stall of decode: a node whose last row was idle is not judged.

A stall's start is the start of its first stalled row, carried across batches per node
(``NodeArrays.stall_from``); a row with tokens, or with nothing running, ends it.

**How a censored sample enters.** ``E[X | X > L] >= max(L, E[X])``: the conditional mean exceeds both
the bound and the node's own mean. So a stalled row enters the node's EMA and evidence as ``L`` (at
equal load, like any decode row) when ``L`` is over the node's current mean, and is skipped when it is
not (it then says nothing the node's mean does not already say). Entering ``L`` is conservative: the
true value is larger. Every sample is then clipped to ``ema_clip`` times the baseline and capped in the
evidence (:mod:`detector.evidence`) like any other.

**Only a stall longer than a hiccup.** A healthy node stalls too, every stream at once, for a moment: a
host hiccup, an ECC replay burst, a long prompt's prefill on an engine without chunked prefill. Those
last well under a second, the same horizon that separates a momentary stall from a fault for
quarantine (``Thresholds.quarantine_persistence_s``, one owner for it), and an inter-token histogram
reports such a gap once, when the next token comes. A stall's rows therefore enter only once it has
lasted that long: a node that stopped is cut about that long after it stopped, and quarantined once it
has stayed stopped for the persistence after that; a half-second hiccup changes nothing it did not
change before. Without this, the two 4x rows of a 0.5 s hiccup took a healthy node's EMA over the
quarantine line and cut it at once.

What this cannot see: a node that answers no scrape at all (a process stopped by SIGSTOP, a wedged
host) gives no row; its scrape failures and the gateway's view of it are the evidence there. When a
vLLM stall ends, the gap also reaches the histogram in the row where it ends: a stall of ``s``
seconds is counted once more in one row.
"""

from __future__ import annotations

import numpy as np

#: A row continues a stall only when the node's last decoding row ended at most this many of the
#: row's intervals before it (scrapes jitter; a node idle for longer is not "decoding right before").
CONTINUITY_INTERVALS = 2.0


def stalled_rows(node: np.ndarray, ts: np.ndarray, interval_s: np.ndarray, tokens: np.ndarray,
                 token_ms: np.ndarray, running: np.ndarray, stall_from: np.ndarray,
                 rows_at: np.ndarray) -> np.ndarray:
    """Which rows are stalled (see the module docstring). ``node`` holds indices grouped by node with
    time order inside each group; ``stall_from`` and ``rows_at`` are the per-node carried state."""
    n = len(node)
    if not n:
        return np.zeros(0, bool)
    zero = tokens == 0
    counted = zero & (token_ms > 0)  # the source itself says streams were decoding
    with np.errstate(invalid="ignore"):
        waiting = zero & ~counted & (running > 0)
    first = np.r_[True, node[1:] != node[:-1]]
    # A run of waiting rows is a stall when the row before the run was decoding: a row of this batch
    # with tokens or a stall, or, for the node's first row, the carried state.
    with np.errstate(invalid="ignore"):
        carried = np.isfinite(stall_from[node]) | (rows_at[node] >= ts - interval_s * (1 + CONTINUITY_INTERVALS))
    head = waiting & (first | ~np.r_[False, waiting[:-1]])
    prev_decoding = np.r_[False, (tokens[:-1] > 0) | counted[:-1]]
    head_ok = np.where(first, carried, prev_decoding)
    run = np.cumsum(head)  # run id of each waiting row (its head's ordinal)
    ok_by_run = np.r_[False, head_ok[head]]
    return counted | (waiting & ok_by_run[run])


def stall_bounds(node: np.ndarray, ts: np.ndarray, interval_s: np.ndarray, stalled: np.ndarray,
                 stall_from: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(bound_ms, stall_from')``: per row, the censored lower bound of the per-token time, ``L`` in
    ms since its stall began (NaN for rows that are not stalled), and the per-node stall start after the
    batch (NaN: not stalled at its last row; unchanged for nodes without rows)."""
    n = len(node)
    out = stall_from.copy()
    bound = np.full(n, np.nan)
    if not n:
        return bound, out
    first = np.r_[True, node[1:] != node[:-1]]
    head = stalled & (first | ~np.r_[False, stalled[:-1]])
    carried = stall_from[node]
    start = np.where(first & np.isfinite(carried), carried, ts - interval_s)
    owner = np.maximum.accumulate(np.where(head, np.arange(n), 0))  # each row's latest run head
    bound = np.where(stalled, (ts - start[owner]) * 1000.0, np.nan)
    last = np.r_[node[1:] != node[:-1], True]
    out[node[last]] = np.where(stalled[last], start[owner[last]], np.nan)
    return bound, out


def informative(bound: np.ndarray, at_load: np.ndarray, own_mean: np.ndarray, hiccup_s: float) -> np.ndarray:
    """Which stalled rows enter (see the module docstring): the stall, ``bound`` ms so far, has lasted at
    least ``hiccup_s``, and its bound at equal load ``at_load`` says more than the node's own mean
    (a node without a mean yet: any finite bound)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(at_load) & (bound >= hiccup_s * 1000.0) & ~(at_load <= own_mean)
