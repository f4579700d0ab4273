"""The per-node state of one group: node ids and one numpy array per field, aligned.

Every rule of the detector is vectorised over the nodes of a group, so per-node state is a table of
columns, not a list of objects: ``nodes.state[i]`` is node ``i``'s state code, ``nodes.evidence`` every
node's evidence. :class:`NodeArrays` declares each column once (its dtype and the value a new node, or a
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
  node's deciding signal last went under the exit line and stayed there; NaN: it is not under it),
  ``cut_weight`` (the least weight, a fraction of base, a degraded node's deciding Z has allowed in its
  current stretch of DEGRADED: its weight never rises above it before it leaves,
  :func:`detector.weights.hold_cut`; NaN: not degraded), ``release_at`` (when a release probe of a
  held DEGRADED node was asked for and not yet answered: :func:`detector.ejection.probes_due`; NaN:
  none);
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, get_type_hints

import numpy as np

NAN = float("nan")


@dataclass(frozen=True)
class Column:
    """One per-node column's declaration: its dtype and the value a new (or reset) node starts from."""

    dtype: type
    fill: float


#: Signals whose completed-request samples are pooled per node and tick (``pool_sum_<s>``: the sum of
#: their logs, ``pool_n_<s>``: their count; :meth:`detector.group.GroupDetector.ingest`).
POOLED: tuple[str, ...] = ("decode", "prefill_time", "norm")


class NodeArrays:
    """Node ids and the per-node columns of :data:`FIELDS` (see the module docstring).

    Each column is declared once, here: its annotation carries its dtype and initial value
    (:class:`Column`), and :data:`FIELDS` and ``__slots__`` are read from these annotations.
    """

    base: Annotated[np.ndarray, Column(np.float64, 0)]
    state: Annotated[np.ndarray, Column(np.int8, 0)]
    joined: Annotated[np.ndarray, Column(np.float64, 0)]
    last_seen: Annotated[np.ndarray, Column(np.float64, NAN)]
    warm_samples: Annotated[np.ndarray, Column(np.int64, 0)]
    new_samples: Annotated[np.ndarray, Column(np.int64, 0)]
    new_requests: Annotated[np.ndarray, Column(np.int64, 0)]
    new_drained: Annotated[np.ndarray, Column(np.int64, 0)]
    cut_at: Annotated[np.ndarray, Column(np.float64, NAN)]
    over_q: Annotated[np.ndarray, Column(np.int64, 0)]
    evidence: Annotated[np.ndarray, Column(np.float64, 0)]
    consec_err: Annotated[np.ndarray, Column(np.int64, 0)]
    int_requests: Annotated[np.ndarray, Column(np.int64, 0)]
    int_success: Annotated[np.ndarray, Column(np.int64, 0)]
    tail: Annotated[np.ndarray, Column(np.int8, 0)]
    tail_windows: Annotated[np.ndarray, Column(np.int64, 0)]
    cross_slow: Annotated[np.ndarray, Column(np.int8, 0)]
    p50: Annotated[np.ndarray, Column(np.float64, NAN)]
    p99: Annotated[np.ndarray, Column(np.float64, NAN)]
    next_probe: Annotated[np.ndarray, Column(np.float64, NAN)]
    passes: Annotated[np.ndarray, Column(np.int64, 0)]
    ejections: Annotated[np.ndarray, Column(np.int64, 0)]
    step: Annotated[np.ndarray, Column(np.int64, 0)]
    step_started: Annotated[np.ndarray, Column(np.float64, NAN)]
    pending_since: Annotated[np.ndarray, Column(np.float64, NAN)]
    healthy_since: Annotated[np.ndarray, Column(np.float64, 0)]
    override_until: Annotated[np.ndarray, Column(np.float64, NAN)]
    pin: Annotated[np.ndarray, Column(np.float64, NAN)]
    pin_until: Annotated[np.ndarray, Column(np.float64, NAN)]
    grace: Annotated[np.ndarray, Column(np.int64, 0)]
    over_d: Annotated[np.ndarray, Column(np.int64, 0)]
    over_q_evals: Annotated[np.ndarray, Column(np.int64, 0)]
    flaps: Annotated[np.ndarray, Column(np.int64, 0)]
    evidence_prefill: Annotated[np.ndarray, Column(np.float64, 0)]
    running: Annotated[np.ndarray, Column(np.float64, NAN)]
    silenced_until: Annotated[np.ndarray, Column(np.float64, NAN)]
    rows_at: Annotated[np.ndarray, Column(np.float64, NAN)]
    q_hits: Annotated[np.ndarray, Column(np.int64, 0)]
    q_count: Annotated[np.ndarray, Column(np.int64, 0)]
    q_held: Annotated[np.ndarray, Column(np.float64, 0)]
    q_seen_at: Annotated[np.ndarray, Column(np.float64, NAN)]
    evidence_q: Annotated[np.ndarray, Column(np.float64, 0)]
    pool_sum_decode: Annotated[np.ndarray, Column(np.float64, 0)]
    pool_n_decode: Annotated[np.ndarray, Column(np.int64, 0)]
    pool_sum_prefill_time: Annotated[np.ndarray, Column(np.float64, 0)]
    pool_n_prefill_time: Annotated[np.ndarray, Column(np.int64, 0)]
    pool_sum_norm: Annotated[np.ndarray, Column(np.float64, 0)]
    pool_n_norm: Annotated[np.ndarray, Column(np.int64, 0)]
    pool_at: Annotated[np.ndarray, Column(np.float64, NAN)]
    stall_from: Annotated[np.ndarray, Column(np.float64, NAN)]
    clear_since: Annotated[np.ndarray, Column(np.float64, NAN)]
    cut_weight: Annotated[np.ndarray, Column(np.float64, NAN)]
    release_at: Annotated[np.ndarray, Column(np.float64, NAN)]
    heavy_since: Annotated[np.ndarray, Column(np.float64, NAN)]
    heavy_last: Annotated[np.ndarray, Column(np.float64, NAN)]
    preempted_at: Annotated[np.ndarray, Column(np.float64, NAN)]

    __slots__ = ("ids", "index", *__annotations__)

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
    def restore(cls, ids: Iterable[str], columns: Mapping[str, np.ndarray]) -> "NodeArrays":
        """Rebuild from :meth:`columns`; a column missing from an older snapshot starts at its initial
        value, a column this version no longer has is ignored."""
        out = cls(ids)
        for name, (dtype, _) in FIELDS.items():
            if name in columns:
                setattr(out, name, np.asarray(columns[name], dtype=dtype).copy())
        return out


#: column -> (dtype, initial value), read from :class:`NodeArrays`' annotations, in their order.
FIELDS: dict[str, tuple[type, float]] = {
    name: (hint.__metadata__[0].dtype, hint.__metadata__[0].fill)
    for name, hint in get_type_hints(NodeArrays, include_extras=True).items()
}
