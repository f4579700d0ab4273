"""CSV exports of the audit log, the transitions and the incidents, for the post-incident review and the
spreadsheet an SRE attaches to it. The same filters as the pages and the API (``group``, ``node`` by id
or name, ``since``/``until``, ...: :mod:`outlier_admin.api.filters`), streamed with the standard
library's :mod:`csv` (Django's "streaming large CSV files" recipe), at most :data:`EXPORT_MAX_ROWS` rows.

**Formula injection.** A cell is text a spreadsheet may run: node names and addresses come from
gateways' records, reasons from operators, and ``=HYPERLINK(...)`` in a node name would become a live
formula in the reviewer's spreadsheet. Every cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return is written with a leading ``'`` (OWASP's CSV-injection rule), so it stays text;
numbers are written as numbers (a negative Z is not a formula).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import orjson
from django.http import StreamingHttpResponse

#: The largest export, in rows (the newest first): a year of a busy fleet's audit is not one request.
EXPORT_MAX_ROWS = 100_000
#: First characters that make a spreadsheet read a cell as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> str:
    """One value as a CSV cell: ISO-8601 times, JSON for structures, text never read as a formula."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float):  # a number is no formula: a negative Z stays a number
        return str(value)
    text = orjson.dumps(value).decode() if isinstance(value, dict | list) else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


class _Echo:
    """A file-like object whose ``write`` returns the line (csv.writer writes, the response streams)."""

    def write(self, value: str) -> str:
        return value


def csv_response(filename: str, header: list[str], rows: Iterable[Iterable[Any]]) -> StreamingHttpResponse:
    """A streamed ``text/csv`` attachment: ``header``, then each row's cells (:func:`cell`)."""
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow([cell(v) for v in row])

    resp = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    resp["Content-Disposition"] = f'attachment; filename="{filename}"'
    return resp


AUDIT_COLUMNS = ["at", "actor", "action", "group", "node", "reason", "detail"]
TRANSITION_COLUMNS = ["at", "group", "node", "address", "from_state", "to_state", "reason", "signal", "z",
                      "baseline", "spread", "ema", "shadow", "detail"]


INCIDENT_COLUMNS = ["started_at", "ended_at", "group", "node", "first_state", "worst_state", "reason", "signal",
                    "unit", "z", "ema", "baseline", "cause", "quarantined_at", "probes_failed",
                    "restore_steps_failed", "outcome"]


def audit_rows(qs: Any) -> Iterator[list[Any]]:
    for e in qs.select_related("group", "node").order_by("-at", "-pk")[:EXPORT_MAX_ROWS].iterator(chunk_size=2000):
        yield [e.at, e.actor, e.action, e.group.name if e.group else None, e.node.name if e.node else None,
               e.reason, e.detail]


def transition_rows(qs: Any) -> Iterator[list[Any]]:
    for t in qs.select_related("group", "node").order_by("-at", "-pk")[:EXPORT_MAX_ROWS].iterator(chunk_size=2000):
        yield [t.at, t.group.name, t.node.name, t.node.address, t.from_state, t.to_state, t.reason, t.signal, t.z,
               t.baseline, t.spread, t.ema, t.shadow, (t.explanation or {}).get("detail", "")]


def incident_rows(qs: Any) -> Iterator[list[Any]]:
    from outlier_admin.control.incidents import cause_text

    for i in qs.select_related("group", "node").order_by("-started_at", "-pk")[:EXPORT_MAX_ROWS].iterator(
            chunk_size=2000):
        yield [i.started_at, i.ended_at, i.group.name, i.node.name, i.first_state, i.worst_state, i.reason, i.signal,
               i.unit, i.z, i.ema, i.baseline, cause_text(i), i.quarantined_at, i.probes_failed,
               i.restore_steps_failed, i.outcome or "open"]
