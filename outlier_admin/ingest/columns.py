"""Ingest records checked a batch at once: :func:`normalize_many`, :func:`records.normalize
<contract.normalize.normalize>` column by column.

Apart from :mod:`contract.normalize` because it needs numpy and the stream row layout
(:mod:`detector.samples`), and ``records`` does not: the log parsers import it, and they run on a
gateway host from ``outlier-admin-agent`` (redis-py only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from contract.names import NameError_, validate_group_name, validate_node_id
from contract.normalize import MISSING, NOT_AN_OBJECT, REQUIRED, RecordError, normalize
from contract.records import (
    DEFAULT_STATUS,
    FIELDS,
    STATUS,
    TOKENS,
    Limits,
    fields_ok,
    request_id_ok,
    status_ok,
    ts_window,
)
from detector.samples import REQUEST_ROW_FIELDS

#: A record as :func:`normalize_many` returns it: the fields of a stream row
#: (:data:`detector.samples.REQUEST_ROW_FIELDS`, so ``canonical[:9]`` is the row), then the group
#: and the request id.
CANONICAL_FIELDS: tuple[str, ...] = (*REQUEST_ROW_FIELDS, "group", "request_id")

# HTTP push sends thousands of records a body, and :func:`normalize` costs ~8 µs a record in the
# interpreter: at 50,000 records/s that alone is 40% of a core. :func:`normalize_many` checks the
# batch column by column instead (one numpy comparison per rule, each distinct node and group name
# validated once by :mod:`contract.names`), and is a *screen*: a record it cannot show to
# be accepted, with exactly the values :func:`normalize` would give, goes through :func:`normalize`
# itself, which keeps the one definition of the rules and of every refusal's reason. Anything
# unusual (a string or bool where a number goes, a value past 2**53, a ``ts`` in RFC 3339, a
# missing field) is such a record. ``tests/outlier_admin/ingest/test_normalize_many.py`` checks the
# two agree on every record, adversarial ones included.

_SCREEN_MIN = 16  # below this, numpy's fixed cost per column is more than normalize's per record
_EXACT = 2.0**53  # an int past this is not exact as a double: left to normalize's Python comparisons
_NUMBER = frozenset((int, float))
_NUMBER_OR_NONE = frozenset((int, float, type(None)))
_NAME_OR_NONE = frozenset((str, type(None)))
_NONE = {type(None)}
_BAD = object()  # a name that is not valid (or not a string): the record goes through normalize
#: The numeric fields read as float columns (``status`` has its own: ints, :func:`_statuses_ok`).
_NUMBERS = tuple(name for name, f in FIELDS.items() if f is not STATUS)


def limits() -> dict[str, float]:
    """The bounds :func:`normalize` takes, from the ``INGEST_*`` settings (their one reader)."""
    from django.conf import settings

    return {
        "max_future_s": settings.INGEST_MAX_FUTURE_S, "retention_s": settings.INGEST_RETENTION_S,
        "max_latency_ms": settings.INGEST_MAX_LATENCY_MS, "max_prompt_tokens": settings.INGEST_MAX_PROMPT_TOKENS,
        "max_completion_tokens": settings.INGEST_MAX_COMPLETION_TOKENS,
    }


def canonical(rec: dict[str, Any]) -> tuple[Any, ...]:
    """A canonical record (:func:`normalize`'s dict) as a tuple laid out as :data:`CANONICAL_FIELDS`."""
    return tuple(rec[k] for k in CANONICAL_FIELDS)


def _one(rec: Any, now: float, bounds: dict[str, Any]) -> tuple[Any, ...] | RecordError:
    try:
        return canonical(normalize(rec, now=now, **bounds))
    except RecordError as exc:
        return exc


def _floats(values: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, given, odd)`` of a column: the values as float64 (NaN where absent), where a value was
    given (not ``None``), and where it is given but not a plain int/float exact as a double (those
    records are left to :func:`normalize`)."""
    n = len(values)
    kinds = set(map(type, values))
    if kinds == _NONE:  # an optional field no record carries
        return np.full(n, math.nan), np.zeros(n, bool), np.zeros(n, bool)
    if kinds <= _NUMBER_OR_NONE:
        has_none = type(None) in kinds
        try:
            x = np.array([math.nan if v is None else v for v in values] if has_none else values, dtype=np.float64)
        except OverflowError:  # an int past a double's range: the slow way below
            pass
        else:
            given = np.fromiter((v is not None for v in values), bool, n) if has_none else np.ones(n, bool)
            odd = np.abs(x) > _EXACT if int in kinds else np.zeros(n, bool)
            return x, given, odd
    x, given, odd = np.full(n, math.nan), np.zeros(n, bool), np.zeros(n, bool)
    for i, v in enumerate(values):
        if v is None:
            continue
        given[i] = True
        kind = type(v)
        if kind is float or (kind is int and -_EXACT <= v <= _EXACT):
            x[i] = v
        else:
            odd[i] = True
    return x, given, odd


def _names(values: list[Any], check: Callable[[str], str], *, required: bool) -> tuple[list[Any], np.ndarray]:
    """``(names, ok)``: each value validated by ``check`` once per distinct string (names repeat
    across a batch; stripped first, as in :func:`normalize`): the name, or ``None`` where absent;
    ``ok`` is False where a value is not a valid name (or absent, when ``required``)."""
    n = len(values)
    if not set(map(type, values)) <= _NAME_OR_NONE:
        values = [v if v is None or type(v) is str else _BAD for v in values]
    verdict: dict[Any, Any] = {None: None, _BAD: _BAD}
    refused = {_BAD, None} if required else {_BAD}
    distinct = set(values)
    for name in distinct:
        if name is None or name is _BAD:
            continue
        try:
            verdict[name] = check(name.strip())
        except NameError_:
            verdict[name] = _BAD
    names = list(map(verdict.__getitem__, values))
    if all(verdict[name] not in refused for name in distinct):
        return names, np.ones(n, bool)
    return names, np.fromiter((name not in refused for name in names), bool, n)


def _ints(x: np.ndarray, where: np.ndarray) -> list[int | None]:
    """``int(value)`` where ``where``, else ``None``."""
    if where.all():
        return x.astype(np.int64).tolist()
    values = np.where(where, x, 0.0).astype(np.int64).tolist()
    return [v if w else None for v, w in zip(values, where.tolist(), strict=True)]


def _opt_floats(x: np.ndarray, where: np.ndarray) -> list[float | None]:
    """``float(value)`` where ``where``, else ``None``."""
    if where.all():
        return x.tolist()
    if not where.any():
        return [None] * len(x)
    return [v if w else None for v, w in zip(x.tolist(), where.tolist(), strict=True)]


def _statuses_ok(status: list[Any]) -> np.ndarray:
    """Where each status is one the contract accepts (:data:`contract.records.STATUS`): one numpy
    comparison when every status is a plain int, else :func:`~contract.records.status_ok` each."""
    n = len(status)
    if set(map(type, status)) != {int}:
        return np.fromiter(map(status_ok, status), bool, n)
    try:
        code = np.array(status, dtype=np.int64)
    except OverflowError:  # an int past int64: left to normalize, which refuses it
        return np.zeros(n, bool)
    return STATUS.within(code, STATUS.high)


@dataclass
class _Columns:
    """A batch read column by column: the names validated, each numeric field of the table as
    :func:`_floats` reads it (``x``, ``given``, ``odd`` by field name), the statuses (default
    filled in), the request ids (an empty one as None) and where each is one the contract accepts
    (None: the batch has none)."""

    node_column: list[Any]
    nodes: list[Any]
    nodes_ok: np.ndarray
    groups: list[Any]
    groups_ok: np.ndarray
    ts: np.ndarray
    ts_given: np.ndarray
    ts_odd: np.ndarray
    x: dict[str, np.ndarray]
    given: dict[str, np.ndarray]
    odd: dict[str, np.ndarray]
    status: list[Any]
    request_ids: list[Any]
    request_ids_ok: np.ndarray | None


def _columns(recs: Sequence[Any]) -> _Columns:
    """Every field of the batch as a column (a record that is not an object: every field missing)."""
    empty: dict[str, Any] = {}
    dicts = [rec if type(rec) is dict else empty for rec in recs]

    def column(key: str) -> list[Any]:
        return list(map(dict.get, dicts, repeat(key)))

    node_column = column("node")
    nodes, nodes_ok = _names(node_column, validate_node_id, required=True)
    groups, groups_ok = _names(column("group"), validate_group_name, required=False)
    ts, ts_given, ts_odd = _floats(column("ts"))
    x, given, odd = {}, {}, {}
    for name in _NUMBERS:
        x[name], given[name], odd[name] = _floats(column(name))
    request_ids, request_ids_ok = column("request_id"), None
    if set(map(type, request_ids)) != {type(None)}:
        request_ids_ok = np.fromiter(map(request_id_ok, request_ids), bool, len(recs))
        request_ids = [rid or None for rid in request_ids]
    return _Columns(
        node_column=node_column, nodes=nodes, nodes_ok=nodes_ok, groups=groups, groups_ok=groups_ok, ts=ts,
        ts_given=ts_given, ts_odd=ts_odd, x=x, given=given, odd=odd,
        status=list(map(dict.get, dicts, repeat("status"), repeat(DEFAULT_STATUS))), request_ids=request_ids,
        request_ids_ok=request_ids_ok)


def _screen(cols: _Columns, now: float, limits: Limits) -> np.ndarray:
    """Where a record is shown to be accepted, with exactly :func:`normalize`'s values: ``ts`` a plain
    number within the window, every numeric field within the table's bounds (:func:`fields_ok`,
    cross-field rules included; an odd value is left to normalize), not 0 and 0 tokens, a status and
    a request id the contract accepts, valid names."""
    tokens = _tokens(cols)
    prompt, completion = (cols.x[name] for name in TOKENS)
    with np.errstate(invalid="ignore"):  # NaN compares False: an absent or non-finite value fails its rule
        earliest, latest = ts_window(now, limits)
        ok = cols.ts_given & ~cols.ts_odd & (cols.ts <= latest) & (cols.ts >= earliest)
        # A count that is given is checked even when its partner is missing (normalize's rule).
        ok &= fields_ok(cols.x, cols.given, limits, cols.odd)
        ok &= ~(tokens & (prompt == 0) & (completion == 0))
    ok &= _statuses_ok(cols.status)
    if cols.request_ids_ok is not None:
        ok &= cols.request_ids_ok
    return ok & cols.nodes_ok & cols.groups_ok


def _tokens(cols: _Columns) -> np.ndarray:
    """Where a record gives both token counts (:data:`contract.records.TOKENS`; else it is latency-only)."""
    first, second = TOKENS
    return cols.given[first] & cols.given[second]


def _canonical_rows(cols: _Columns, ok: np.ndarray) -> list[tuple[Any, ...] | RecordError]:
    """Each record's canonical tuple (:data:`CANONICAL_FIELDS`), read off the columns: exact where
    ``ok``, to be replaced by :func:`_refusals` elsewhere."""
    x, given = cols.x, cols.given
    tokens = _tokens(cols)
    with_cached = tokens & given["cached_tokens"]
    with_queue = given["ttft_ms"] & given["queue_ms"]
    return list(zip(
        cols.nodes, cols.ts.tolist(), _ints(x["prompt_tokens"], tokens & ok), _ints(x["completion_tokens"], tokens & ok),
        _opt_floats(x["ttft_ms"], given["ttft_ms"]), x["total_ms"].tolist(), cols.status,
        _ints(x["cached_tokens"], with_cached & ok), _opt_floats(x["queue_ms"], with_queue), cols.groups,
        cols.request_ids, strict=True))


def _refusals(recs: Sequence[Any], cols: _Columns, ok: np.ndarray, out: list[tuple[Any, ...] | RecordError],
              now: float, bounds: dict[str, Any]) -> None:
    """Put in ``out`` the error of each record the screen did not accept. What normalize would refuse
    first is read off the columns: not an object, or a required field absent (in normalize's order),
    a ``ts`` outside the window. No exception raised per record (one shared error for the first two):
    a garbage line costs less than a valid one. The rest go through normalize for their reason (or
    are accepted by it: the screen leaves anything unusual to it)."""
    n = len(recs)
    ts = cols.ts
    given = {"ts": cols.ts_given, "total_ms": cols.given["total_ms"],
             "node": np.fromiter((v is not None for v in cols.node_column), bool, n)}
    shared = [(np.fromiter((type(rec) is not dict for rec in recs), bool, n), RecordError(*NOT_AN_OBJECT))]
    shared += [(~given[key], RecordError(*MISSING[key])) for key in REQUIRED]
    # Then a plain number for ts outside the window: normalize's next refusal, with its detail.
    earliest, latest = ts_window(now, Limits(**bounds))
    with np.errstate(invalid="ignore"):
        plain_ts = cols.ts_given & ~cols.ts_odd & np.isfinite(ts)
        future, old = plain_ts & (ts > latest), plain_ts & (ts < earliest)
    for i in np.flatnonzero(~ok).tolist():
        for refused, error in shared:
            if refused[i]:
                out[i] = error
                break
        else:
            if future[i]:
                out[i] = RecordError("ts_in_future", f"ts is {ts[i] - now:.0f} s in the future "
                                     f"(limit {bounds['max_future_s']:.0f} s)")
            elif old[i]:
                out[i] = RecordError("ts_too_old", f"ts is {now - ts[i]:.0f} s old "
                                     f"(retention {bounds['retention_s']:.0f} s)")
            else:
                out[i] = _one(recs[i], now, bounds)


def normalize_many(
    recs: Sequence[Any],
    *,
    now: float,
    max_future_s: float,
    retention_s: float,
    max_latency_ms: float,
    max_prompt_tokens: int,
    max_completion_tokens: int,
) -> list[tuple[Any, ...] | RecordError]:
    """:func:`normalize` of every record of a batch: per record, its canonical tuple
    (:data:`CANONICAL_FIELDS`) or the :class:`RecordError` that refused it. Same rules, reasons and
    values as :func:`normalize` (see the comment above), at a fraction of the cost: the batch read as
    columns, screened, laid out as canonical tuples, and the records the screen did not accept given
    their reason."""
    bounds = {"max_future_s": max_future_s, "retention_s": retention_s, "max_latency_ms": max_latency_ms,
              "max_prompt_tokens": max_prompt_tokens, "max_completion_tokens": max_completion_tokens}
    if len(recs) < _SCREEN_MIN:
        return [_one(rec, now, bounds) for rec in recs]
    cols = _columns(recs)
    ok = _screen(cols, now, Limits(**bounds))
    out = _canonical_rows(cols, ok)
    if not ok.all():
        _refusals(recs, cols, ok, out, now, bounds)
    return out
