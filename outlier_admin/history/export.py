"""CSV exports of the audit log, the transitions and the incidents, for the post-incident review and the
spreadsheet an SRE attaches to it. The same filters as the pages and the API (``group``, ``node`` by id
or name, ``since``/``until``, ...: :mod:`outlier_admin.history.filters`), streamed with the standard
library's :mod:`csv` (Django's "streaming large CSV files" recipe), at most :data:`EXPORT_MAX_ROWS` rows.

**Formula injection.** A cell is text a spreadsheet may run: node names and addresses come from
gateways' records, reasons from operators, and ``=HYPERLINK(...)`` in a node name would become a live
formula in the reviewer's spreadsheet. OWASP's CSV-injection rule, applied where spreadsheets look:

- a cell whose first visible character is ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is
  written with a leading ``'``, so it stays text. "First visible": spreadsheets skip a byte-order mark
  and zero-width characters (``\ufeff=1+1`` runs in LibreOffice), so a run of them (and of spaces) is
  looked through, and the ``'`` goes before it;
- a spreadsheet that splits on ``;`` (most of Europe's locales) or on tabs reads ``x;=cmd|...`` as two
  cells, the second a formula: every part of a cell after a ``,``, ``;``, tab or line break is judged
  the same way (its ``'`` goes after the separator), and
- every cell that holds such a separator or a quote is quoted (``csv.QUOTE_ALL`` on text: whatever
  the reader's separator, the cell is one cell).

Numbers are written as numbers, unquoted (a negative Z is not a formula). :func:`csv_response` is the
one CSV writer of the project: every export (audit, transitions, incidents) goes through it."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import orjson
from django.http import StreamingHttpResponse

#: The largest export, in rows (the newest first): a year of a busy fleet's audit is not one request.
EXPORT_MAX_ROWS = 100_000
#: First characters that make a spreadsheet read a cell as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: Characters a spreadsheet skips before it looks for a formula: BOM, zero-width and joiners, the
#: word joiner and invisible operators, bidi marks and isolates, soft hyphen, and spaces.
INVISIBLE = "\ufeff\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\u206a\u206b\u206c\u206d\u206e\u206f" \
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u00ad\u180e\u034f \u00a0"
#: Cell separators some spreadsheet's import splits on (``,`` ``;`` tab) and line breaks.
SEPARATORS = re.compile(r"([,;\t\r\n])")


def _defuse(part: str) -> str:
    """``part`` with a ``'`` in front when its first visible character starts a formula."""
    return "'" + part if part.lstrip(INVISIBLE).startswith(FORMULA_START) else part


def cell(value: Any) -> str | int | float:
    """One value as a CSV cell: ISO-8601 times, JSON for structures, text never read as a formula
    (module docstring); numbers as they are."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):  # a number is no formula: a negative Z stays a number
        return value
    text = orjson.dumps(value).decode() if isinstance(value, dict | list) else str(value)
    text = _defuse(text)
    if SEPARATORS.search(text):
        # The parts after each separator: "x;=cmd" -> "x;'=cmd" (a separator itself is kept; a tab
        # that starts a part is a formula start only at the cell's start, handled above).
        parts = SEPARATORS.split(text)
        text = parts[0] + "".join(sep + _defuse(part) for sep, part in zip(parts[1::2], parts[2::2], strict=True))
    return text


class _Echo:
    """A file-like object whose ``write`` returns the line (csv.writer writes, the response streams)."""

    def write(self, value: str) -> str:
        return value


def csv_response(filename: str, header: list[str], rows: Iterable[Iterable[Any]]) -> StreamingHttpResponse:
    """A streamed ``text/csv`` attachment: ``header``, then each row's cells (:func:`cell`)."""
    # QUOTE_NONNUMERIC: every text cell quoted (a separator of any reader stays inside its cell), numbers
    # (cell() passes them through) bare.
    writer = csv.writer(_Echo(), quoting=csv.QUOTE_NONNUMERIC)

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
