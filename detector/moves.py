"""State edges as an evaluation takes them: every change of a node's state goes through one call that
checks the edge against :data:`~detector.states.ALLOWED_EDGES` and records it, so the explanation
of every transition is built from what actually happened, in order.

(Kept apart from :mod:`detector.states`, which is plain Python: the gateway client reads the traffic
table there without numpy.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from detector.states import NodeState, Reason, check_edge


def lookup(states: Iterable[NodeState]) -> np.ndarray:
    """Boolean table indexed by state code: ``lookup(X)[state_array]`` is ``state in X`` per node,
    one gather instead of ``np.isin`` (which sorts) on every tick."""
    table = np.zeros(len(NodeState), dtype=bool)
    table[[int(x) for x in states]] = True
    return table


@dataclass(frozen=True)
class Move:
    """One edge taken by node ``i`` during an evaluation (a node may take two in one tick: an
    expiry, then a probe). ``safeguard_hold``: the detector wanted the node out and the safeguard cap
    held it in service at the floor weight instead (:func:`detector.ejection.eject`)."""

    i: int
    src: NodeState
    dst: NodeState
    reason: Reason
    detail: str = ""
    safeguard_hold: bool = False


class Moves:
    """The state edges of one evaluation, taken in order and recorded as they are taken: every
    change of ``state`` goes through :meth:`__call__`, which checks the edge and keeps the record
    the explanation is built from."""

    def __init__(self, state: np.ndarray) -> None:
        self.state = state  # the group's state column, changed in place
        self.taken: list[Move] = []
        self.moved = np.zeros(len(state), dtype=bool)

    def __call__(self, mask: np.ndarray, to: NodeState, reason: Reason, detail: str = "", *,
                 safeguard_hold: bool = False) -> None:
        mask = mask & (self.state != to)
        for i in np.flatnonzero(mask):
            src = NodeState(int(self.state[i]))
            check_edge(src, to)
            self.taken.append(Move(int(i), src, to, reason, detail, safeguard_hold))
        self.state[mask] = to
        self.moved[mask] = True

    def one(self, i: int, to: NodeState, reason: Reason, detail: str = "") -> None:
        mask = np.zeros(len(self.state), dtype=bool)
        mask[i] = True
        self(mask, to, reason, detail)

