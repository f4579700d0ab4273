"""The audit log as a person reads it: runs of registrations folded into one entry.

Registering a fleet writes one ``node.register`` event per node, with the same actor and group and
seconds apart; forty of them in a row pushed every decision an operator took off the first page.
:func:`fold` keeps every event (nothing is hidden: a folded run lists its nodes and expands to its
rows) and folds each run of at least :data:`MIN_RUN` consecutive events of a :data:`FOLDED` action by
the same actor in the same group into one :class:`Run`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Actions written once per node in bulk (a fleet registered, retired or brought back).
FOLDED = frozenset({"node.register", "node.retire", "node.unretire"})
MIN_RUN = 3


@dataclass(frozen=True)
class Run:
    """``events`` (newest first): consecutive events of one :data:`FOLDED` action by one actor in one group."""

    events: list[Any]

    @property
    def action(self) -> str:
        return self.events[0].action

    @property
    def actor(self) -> str:
        return self.events[0].actor

    @property
    def group(self) -> Any:
        return self.events[0].group

    @property
    def newest(self) -> datetime:
        return self.events[0].at

    @property
    def oldest(self) -> datetime:
        return self.events[-1].at

    @property
    def nodes(self) -> list[str]:
        return [e.node.name for e in reversed(self.events) if e.node is not None]


def fold(events: Iterable[Any]) -> list[Any]:
    """``events`` (audit rows, in page order) with each run of :data:`MIN_RUN` or more consecutive
    :data:`FOLDED` events of the same action, actor and group as one :class:`Run`."""
    out: list[Any] = []
    run: list[Any] = []

    def close() -> None:
        out.extend([Run(list(run))] if len(run) >= MIN_RUN else run)
        run.clear()

    for e in events:
        if run and (e.action, e.actor, e.group_id) != (run[0].action, run[0].actor, run[0].group_id):
            close()
        if e.action in FOLDED:
            run.append(e)
        else:
            close()
            out.append(e)
    close()
    return out
