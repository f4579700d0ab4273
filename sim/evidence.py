"""Where a detection's delay goes: what physics fixes, and the detector's own share.

For one fault on one node the delay from the onset to a cut is cut into the parts that happen in order:

1. **onset -> work**: the node next has work (a request in service at or after the onset). A node
   with nothing to do shows no fault; this part is the load's, not the detector's.
2. **work -> first evidence**: the first sample that *could* show the slowdown, of the kinds the
   detector reads: a scrape row of the node's ``/metrics`` carrying tokens decoded after the onset (a
   row at ``t`` covers the scrape period before ``t``: a row with tokens taken after the onset and
   after the node had work again), or an
   access-log line of a request that was in service after the onset (its answer, error or timeout
   logged after the onset). Nothing can cut sooner without reading something else (a probe, a
   connection refused).
3. **first evidence -> cut**: **the detector's own share**, in seconds and in samples (the samples
   of those kinds from the first evidence to the cut, both included): the evidence the detector asked
   for before it acted. This is the figure a detector change moves; parts 1 and 2 are the same for
   every detector that reads the same samples.
4. **cut -> quarantine**.

:func:`decompose` works on plain times, so the simulator's report (:mod:`sim.report`) and the
real-engine drill (``bench/drill``: the server's scrape rows and the router's log lines) compute the
same parts. A cut before the first evidence (``detector_s`` < 0) was made on something else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def decompose(onset: float, *, busy: Sequence[tuple[float, float]] | np.ndarray = (),
              rows: Sequence[float] | np.ndarray = (), lines: Sequence[float] | np.ndarray = (),
              cut: float | None = None, quarantine: float | None = None) -> dict[str, Any]:
    """The parts of one fault's detection delay (module docstring), seconds after ``onset``.

    ``busy``: the node's requests' service intervals ``(start, end)`` (``end`` NaN or inf: still in
    service); ``rows``: the times of the node's scrape rows that carry decoded tokens (empty when the
    detector reads no rows); ``lines``: the times the node's access-log lines were written (answers,
    errors and timeouts); ``cut`` / ``quarantine``: the times of the first cut and quarantine after
    the onset (``None``: never). Returns ``to_work_s``, ``to_evidence_s``, ``evidence`` (``row`` or
    ``line``), ``to_cut_s``, ``detector_s``, ``detector_samples``, ``to_quarantine_s`` and
    ``cut_to_quarantine_s`` (``None`` where a part did not happen)."""
    b = np.asarray(busy, dtype=np.float64).reshape(-1, 2)
    end = np.where(np.isfinite(b[:, 1]), b[:, 1], math.inf) if len(b) else b[:, 1]
    running = len(b) and bool(((b[:, 0] <= onset) & (end > onset)).any())
    later = b[:, 0][b[:, 0] >= onset] if len(b) else b[:, 0]
    work = onset if running else (float(later.min()) if len(later) else None)
    r = np.sort(np.asarray(rows, dtype=np.float64))
    ln = np.sort(np.asarray(lines, dtype=np.float64))
    # A row carries post-onset tokens when it was taken after the onset and after the node had work
    # again (tokens of a request that ended before the onset are not the fault's).
    first_row = r[r > (onset if work is None else max(onset, work))][:1] if work is not None else r[:0]
    first_line = ln[ln > onset][:1]
    firsts = [(float(first_row[0]), "row")] if len(first_row) else []
    firsts += [(float(first_line[0]), "line")] if len(first_line) else []
    evidence, kind = min(firsts) if firsts else (None, None)
    out: dict[str, Any] = {
        "to_work_s": _r(work - onset if work is not None else None),
        "to_evidence_s": _r(evidence - onset if evidence is not None else None), "evidence": kind,
        "to_cut_s": _r(cut - onset if cut is not None else None),
        "detector_s": None, "detector_samples": None,
        "to_quarantine_s": _r(quarantine - onset if quarantine is not None else None),
        "cut_to_quarantine_s": _r(quarantine - cut if quarantine is not None and cut is not None else None),
    }
    if cut is not None and evidence is not None:
        out["detector_s"] = _r(cut - evidence)
        n = int(((r >= evidence) & (r <= cut)).sum() + ((ln >= evidence) & (ln <= cut)).sum())
        out["detector_samples"] = n
    return out
