"""The per-node state of one group: node ids and one numpy array per field, aligned.

Every rule of the detector is vectorised over the nodes of a group, so per-node state is a table of
columns, not a list of objects: ``nodes.state[i]`` is node ``i``'s state code, ``nodes.evidence`` every
node's evidence. :data:`FIELDS` declares each column once (its dtype and the value a new node, or a
reset one, starts from); adding a node appends a row, removing one deletes it, and a snapshot stores
the columns by name, so a snapshot written before a column existed restores with that column at its
initial value.

Columns, by the part of the detector that owns them:

- membership: ``base`` (base weight), ``state`` (:class:`~detector.states.NodeState` code), ``joined``,
  ``last_seen``, ``healthy_since``;
- per-tick sample counts: ``new_samples`` (EMA samples; a streamed row counts its streams),
  ``new_requests`` (completed requests), ``new_drained`` (requests dispatched ``queue_drain_s`` after
  the node's weight was cut), ``warm_samples``, ``grace``;
- Z persistence and the weight-cut gate: ``over_q``, ``over_q_evals``, ``q_held`` (seconds at
  quarantine strength, leaky), ``q_seen_at`` (the node's last evaluation with new samples),
  ``q_hits``/``q_count`` (this tick's evidence samples over the quarantine line / in all), ``evidence_q``
  (the CUSUM over the quarantine line: strength, next to that duration), ``over_d``, ``evidence``
  (the CUSUM on decode, or on norm when the group has no queue-free signal), ``evidence_prefill`` (on
  the queue-free prefill time), ``flaps``, ``cut_at``, ``clear_since`` (when a degraded or pending
  node's deciding signal last went under the exit line and stayed there; NaN: it is not under it);
- the engine: ``heavy_since``, ``heavy_last`` (the first and last row of the node's current episode
  of rows with more prompt work per decode token than the decode curve covers; NaN: none),
  ``preempted_at`` (the last row in which the node preempted a request; NaN: none seen),
  ``running`` (the node's last reported running batch; NaN: never reported), ``rows_at``
  (when its last progress row arrived: its decode is then measured by the rows, not by its requests),
  ``stall_from`` (when its in-flight streams stopped making progress; NaN: they did not,
  :mod:`detector.inflight`);
- completed requests pooled per node and tick (:data:`POOLED`): ``pool_sum_<signal>``, ``pool_n_<signal>``,
  ``pool_at`` (when the node's last pooled observation was taken);
- tail and cross-P50: ``tail``, ``tail_windows``, ``cross_slow``, ``p50``, ``p99``;
- errors: ``consec_err``, ``int_requests``, ``int_success``;
- quarantine, canary and restore: ``next_probe``, ``passes``, ``ejections``, ``step``,
  ``step_started``, ``pending_since``;
- operator overrides: ``override_until``, ``pin``, ``pin_until``, ``silenced_until`` (an operator
  rejected a latency proposal and silenced the case: latency causes do not take the node out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

NAN = float("nan")

#: column -> (dtype, initial value)
FIELDS: dict[str, tuple[type, float]] = {
    "base": (np.float64, 0),
    "state": (np.int8, 0),
    "joined": (np.float64, 0),
    "last_seen": (np.float64, NAN),
    "warm_samples": (np.int64, 0),
    "new_samples": (np.int64, 0),
    "new_requests": (np.int64, 0),
    "new_drained": (np.int64, 0),
    "cut_at": (np.float64, NAN),
    "over_q": (np.int64, 0),
    "evidence": (np.float64, 0),
    "consec_err": (np.int64, 0),
    "int_requests": (np.int64, 0),
    "int_success": (np.int64, 0),
    "tail": (np.int8, 0),
    "tail_windows": (np.int64, 0),
    "cross_slow": (np.int8, 0),
    "p50": (np.float64, NAN),
    "p99": (np.float64, NAN),
    "next_probe": (np.float64, NAN),
    "passes": (np.int64, 0),
    "ejections": (np.int64, 0),
    "step": (np.int64, 0),
    "step_started": (np.float64, NAN),
    "pending_since": (np.float64, NAN),
    "healthy_since": (np.float64, 0),
    "override_until": (np.float64, NAN),
    "pin": (np.float64, NAN),
    "pin_until": (np.float64, NAN),
    "grace": (np.int64, 0),
    "over_d": (np.int64, 0),
    "over_q_evals": (np.int64, 0),
    "flaps": (np.int64, 0),
    "evidence_prefill": (np.float64, 0),
    "running": (np.float64, NAN),
    "silenced_until": (np.float64, NAN),
    "rows_at": (np.float64, NAN),
    "q_hits": (np.int64, 0),
    "q_count": (np.int64, 0),
    "q_held": (np.float64, 0),
    "q_seen_at": (np.float64, NAN),
    "evidence_q": (np.float64, 0),
    "pool_sum_decode": (np.float64, 0),
    "pool_n_decode": (np.int64, 0),
    "pool_sum_prefill_time": (np.float64, 0),
    "pool_n_prefill_time": (np.int64, 0),
    "pool_sum_norm": (np.float64, 0),
    "pool_n_norm": (np.int64, 0),
    "pool_at": (np.float64, NAN),
    "stall_from": (np.float64, NAN),
    "clear_since": (np.float64, NAN),
    "heavy_since": (np.float64, NAN),
    "heavy_last": (np.float64, NAN),
    "preempted_at": (np.float64, NAN),
}
#: Signals whose completed-request samples are pooled per node and tick (``pool_sum_<s>``: the sum of
#: their logs, ``pool_n_<s>``: their count; :meth:`detector.group.GroupDetector.ingest`).
POOLED: tuple[str, ...] = ("decode", "prefill_time", "norm")


class NodeArrays:
    """Node ids and the per-node columns of :data:`FIELDS` (see the module docstring)."""

    __slots__ = ("ids", "index", *FIELDS)

    base: np.ndarray
    state: np.ndarray
    joined: np.ndarray
    last_seen: np.ndarray
    warm_samples: np.ndarray
    new_samples: np.ndarray
    new_requests: np.ndarray
    new_drained: np.ndarray
    cut_at: np.ndarray
    over_q: np.ndarray
    evidence: np.ndarray
    consec_err: np.ndarray
    int_requests: np.ndarray
    int_success: np.ndarray
    tail: np.ndarray
    tail_windows: np.ndarray
    cross_slow: np.ndarray
    p50: np.ndarray
    p99: np.ndarray
    next_probe: np.ndarray
    passes: np.ndarray
    ejections: np.ndarray
    step: np.ndarray
    step_started: np.ndarray
    pending_since: np.ndarray
    healthy_since: np.ndarray
    override_until: np.ndarray
    pin: np.ndarray
    pin_until: np.ndarray
    grace: np.ndarray
    over_d: np.ndarray
    over_q_evals: np.ndarray
    flaps: np.ndarray
    evidence_prefill: np.ndarray
    running: np.ndarray
    silenced_until: np.ndarray
    rows_at: np.ndarray
    q_hits: np.ndarray
    q_count: np.ndarray
    q_held: np.ndarray
    q_seen_at: np.ndarray
    evidence_q: np.ndarray
    pool_sum_decode: np.ndarray
    pool_n_decode: np.ndarray
    pool_sum_prefill_time: np.ndarray
    pool_n_prefill_time: np.ndarray
    pool_sum_norm: np.ndarray
    pool_n_norm: np.ndarray
    pool_at: np.ndarray
    stall_from: np.ndarray
    clear_since: np.ndarray
    heavy_since: np.ndarray
    heavy_last: np.ndarray
    preempted_at: np.ndarray

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self.ids: list[str] = list(ids)
        self.index: dict[str, int] = {node: i for i, node in enumerate(self.ids)}
        for name, (dtype, fill) in FIELDS.items():
            setattr(self, name, np.full(len(self.ids), fill, dtype=dtype))

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, node: object) -> bool:
        return node in self.index

    def position(self, node: str) -> int:
        try:
            return self.index[node]
        except KeyError:
            raise KeyError(f"unknown node {node!r} in this group") from None

    def append(self, node: str) -> int:
        """Add a node with every column at its initial value; returns its index."""
        if node in self.index:
            raise ValueError(f"node {node!r} is already in the group")
        self.index[node] = len(self.ids)
        self.ids.append(node)
        for name, (dtype, fill) in FIELDS.items():
            setattr(self, name, np.concatenate([getattr(self, name), np.array([fill], dtype=dtype)]))
        return len(self.ids) - 1

    def delete(self, node: str) -> int:
        """Remove a node; returns the index it had."""
        i = self.position(node)
        del self.ids[i]
        self.index = {n: k for k, n in enumerate(self.ids)}
        for name in FIELDS:
            setattr(self, name, np.delete(getattr(self, name), i))
        return i

    def reset(self, i: int, names: Iterable[str]) -> None:
        """Put columns ``names`` of node ``i`` back to their initial values."""
        for name in names:
            getattr(self, name)[i] = FIELDS[name][1]

    def column(self, name: str) -> np.ndarray:
        """One column by name (its array, not a copy)."""
        return getattr(self, name)

    def columns(self) -> dict[str, np.ndarray]:
        """Every column by name (for a snapshot)."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def restore(cls, ids: Iterable[str], columns: Mapping[str, np.ndarray]) -> NodeArrays:
        """Rebuild from :meth:`columns`; a column missing from an older snapshot starts at its initial
        value, a column this version no longer has is ignored."""
        out = cls(ids)
        for name, (dtype, _) in FIELDS.items():
            if name in columns:
                setattr(out, name, np.asarray(columns[name], dtype=dtype).copy())
        return out
