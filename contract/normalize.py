"""The ingest record format and its validation (shared by HTTP push and log tailing).

A record is one finished request as a gateway saw it, stamped (``ts``) with the moment it finished —
when the gateway learned its latency; ``ts - total_ms`` is when it was dispatched::

    {"ts": <epoch seconds or RFC 3339>, "node": "<address or node id>", "group": "<optional>",
     "prompt_tokens": int (optional), "completion_tokens": int (optional),
     "cached_tokens": int (optional), "ttft_ms": float (optional), "queue_ms": float (optional),
     "total_ms": float, "status": int, "request_id": "<optional>"}

:func:`normalize` returns the canonical dict (``ts`` as float epoch seconds, ``ttft_ms`` None when
unknown) or raises :class:`RecordError` with a machine-readable reason code. The numeric rules are
the rows of :data:`contract.records.FIELDS`, read in order (cross-field bounds and the fields a
field needs included), the same table :func:`contract.records.fields_ok` reads for a batch, so a
record accepted here is never refused by the detector (``tests/contract/test_records_validators.py``
ties the two).

**Latency-only records.** Most gateways' default logs (nginx ``combined``, HAProxy ``httplog``,
Envoy's default text format) carry no token counts. Such a record is kept, not refused: unless
*both* ``prompt_tokens`` and ``completion_tokens`` are given, both are ``None`` in the canonical
record (``null`` in the stream row, ``NaN`` in the detector's batch), and the detector judges the
request against its group's peers by its latency alone. A lone count is dropped with its partner:
half a size is no size (the cost model needs both), and keeping it would only look precise.
``cached_tokens`` (OpenAI's ``usage.prompt_tokens_details.cached_tokens``: prompt tokens served
from the prefix cache) is kept on the record when given, bounded by ``prompt_tokens``; ``queue_ms``
(the model server's wait for a batch slot, where a gateway logs it) bounded by ``ttft_ms``: with it
the detector has a queue-free prefill time, ``ttft - queue`` (:mod:`detector.signals`).

Every number is bounded, because one record must not be able to push a node's statistics anywhere.
The fields and their bounds are the records contract, :mod:`contract.records` (its table is the one
owner: ``ingest.columns`` and ``detector.samples.validate`` read it too); the ``max_*`` bounds are
the ``INGEST_*`` settings (:func:`outlier_admin.ingest.columns.limits`). A value outside is refused (``bad_<field>``), never
clipped into range. The node and group are names (:mod:`contract.names`): a node id is
an id, never a URL.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from contract.names import NameError_, validate_group_name, validate_node_id
from contract.records import (
    DEFAULT_STATUS,
    FIELDS,
    HTTP_STATUS,
    MIN_LATENCY_MS,
    REQUEST_ID_MAX,
    REQUIRED,
    STATUS,
    TOKENS,
    Field,
    request_id_ok,
    status_ok,
)

# Re-exported: the log parsers and the tests name them here.
__all__ = ["HTTP_STATUS", "MIN_LATENCY_MS", "REQUEST_ID_MAX", "REQUIRED", "ParseError", "RecordError",
           "normalize", "parse_ts", "request_id_ok", "status_ok"]


class ParseError(ValueError):
    """A line or record that cannot become a sample. ``reason`` is a short code (``bad_json``);
    ``fmt`` the key in :data:`contract.logformats.FORMATS` of the format the line looks
    like ("" when none). Here, with the record format, so that the parsers import this module and it
    imports none of them."""

    def __init__(self, reason: str, detail: str = "", *, fmt: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.fmt = fmt


class RecordError(ParseError):
    """A record was refused; ``reason`` is a short code stored with the rejected input."""


#: The first refusals :func:`normalize` makes, ``(reason, detail)``: a value that is not an object, a
#: required field absent. ``columns.normalize_many`` gives the records it finds so these very errors
#: without calling normalize (a flood of garbage lines costs less than valid records).
NOT_AN_OBJECT = ("not_an_object", "a record must be a JSON object")
MISSING = {key: (f"missing_{key}", f"{key} is required") for key in REQUIRED}


def _iso(text: str, value: Any) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise RecordError("bad_ts", f"ts {value!r} is neither epoch seconds nor RFC 3339") from exc


def parse_ts(value: Any) -> float:
    """Epoch seconds (int/float, or a numeric string) or an RFC 3339 string -> epoch seconds."""
    if isinstance(value, bool):
        raise RecordError("bad_ts", "ts must be epoch seconds or RFC 3339")
    if isinstance(value, int | float):
        try:
            ts = float(value)
        except OverflowError:  # an integer past a double (JSON allows any): not a time
            raise RecordError("bad_ts", "ts is not finite") from None
    elif isinstance(value, str):
        text = value.strip()
        try:
            ts = float(text)
        except ValueError:
            dt = _iso(text, value)
            if dt.tzinfo is None:
                raise RecordError("bad_ts", f"ts {value!r} has no time zone (RFC 3339 needs one)") from None
            ts = dt.timestamp()
    else:
        raise RecordError("bad_ts", "ts must be epoch seconds or RFC 3339")
    if not math.isfinite(ts):
        raise RecordError("bad_ts", "ts is not finite")
    # Milliseconds sent by mistake would look like the year 50000: refuse instead of guessing.
    return ts


def _number(value: Any, field: Field, high: float) -> float:
    """``value`` (a record's ``field``) as a number within the contract's bounds for ``field`` (up to
    ``high``)."""
    key = field.name
    kind = type(value)
    if kind is not int and kind is not float:  # bool is its own type: refused below
        if isinstance(value, str) and len(value) <= 40:
            try:
                value = float(value)
            except ValueError:
                raise RecordError(f"bad_{key}", f"{key} must be a number, got {value!r}") from None
            kind = float
        else:
            raise RecordError(f"bad_{key}", f"{key} must be a number, got {str(value)[:40]!r}")
    # The hot path (ingest runs this for every number of every record): one expression is False for
    # NaN, infinities and values out of bounds alike; the exact reason is worked out only for bad values.
    if not field.within(value, high):
        if kind is float and not math.isfinite(value):
            raise RecordError(f"bad_{key}", f"{key} must be finite")
        if value < 0:
            raise RecordError(f"bad_{key}", f"{key} must be >= 0, got {str(value)[:40]}")
        # str(), not :g: an integer past a double (JSON allows any) cannot be formatted as a float.
        if value > high:
            raise RecordError(f"bad_{key}", f"{key} must be <= {high:g}, got {str(value)[:40]}")
        if value < field.low:
            zero = "0 or " if field.zero_ok else ""
            raise RecordError(f"bad_{key}", f"{key} must be {zero}>= {field.low:g}, got {str(value)[:40]}")
        raise RecordError(f"bad_{key}", f"{key} must be an integer, got {value}")
    return value


#: What :func:`_numbers` reads of each numeric field of the table, in the table's order (``status``
#: has a rule of its own: an int, never a numeric string, with a default).
_PLAN = tuple((f, f.name, f.kind, f.high, f.needs, f.over, f.ceiling())
              for f in FIELDS.values() if f is not STATUS)
_PROMPT, _COMPLETION = TOKENS


def _numbers(rec: dict[str, Any], out: dict[str, Any], max_latency_ms: float, max_prompt_tokens: int,
             max_completion_tokens: int) -> dict[str, Any]:
    """Every numeric field of :data:`contract.records.FIELDS` but ``status``, checked in the table's
    order (a record's first failing rule is its reason), its canonical value (the field's type, or
    ``None``) put in ``out``; returns the values as read, by name. A field is ``None`` where the
    record does not give it or a field it :attr:`~contract.records.Field.needs` is absent (cached
    tokens without both counts, a queue wait without TTFT). A count given is checked even when its
    partner is missing: a bad value is refused, never hidden by the record becoming latency-only. A
    bound naming another field is that field's value as read (cached <= prompt, queue <= TTFT); a
    field whose excess has a reason of its own (:attr:`~contract.records.Field.over`) is first held
    to its :meth:`~contract.records.Field.ceiling` (TTFT: ``max_latency_ms``), then refused under
    that reason (``total_below_ttft``) past the field it names."""
    # Limits and values share one namespace: a row's ``high`` names either (a limit's ``max_`` prefix).
    got: dict[str, Any] = {"max_latency_ms": max_latency_ms, "max_prompt_tokens": max_prompt_tokens,
                           "max_completion_tokens": max_completion_tokens}
    for field, name, kind, high, needs, over, ceiling in _PLAN:
        value = rec.get(name)
        if needs and value is not None:
            for need in needs:
                if got[need] is None:  # not read without it
                    value = None
                    break
        if value is None:
            got[name] = out[name] = None
            continue
        bound = got[high] if type(high) is str else high
        if over is None:
            value = _number(value, field, bound)
        else:
            value = _number(value, field, got[ceiling] if type(ceiling) is str else ceiling)
            if bound < value:
                raise RecordError(over, f"{high} {bound} < {name} {value}")
        got[name] = value
        out[name] = kind(value)
    return got


def normalize(
    rec: Any,
    *,
    now: float,
    max_future_s: float,
    retention_s: float,
    max_latency_ms: float,
    max_prompt_tokens: int,
    max_completion_tokens: int,
) -> dict[str, Any]:
    """Validate one record and return its canonical form (see module docstring). The bounds are the
    ``INGEST_*`` settings (:func:`outlier_admin.ingest.columns.limits`).

    Reason codes: ``not_an_object``, ``missing_<field>``, ``bad_<field>``, ``ts_in_future``,
    ``ts_too_old``, ``total_below_ttft``, ``no_tokens``, ``bad_status``. Without both token counts the
    record is latency-only (``prompt_tokens`` / ``completion_tokens`` None; see the module docstring).
    """
    if not isinstance(rec, dict):
        raise RecordError(*NOT_AN_OBJECT)
    for key in REQUIRED:
        if rec.get(key) is None:
            raise RecordError(*MISSING[key])
    ts = parse_ts(rec["ts"])
    if ts > now + max_future_s:
        raise RecordError("ts_in_future", f"ts is {ts - now:.0f} s in the future (limit {max_future_s:.0f} s)")
    if ts < now - retention_s:
        raise RecordError("ts_too_old", f"ts is {now - ts:.0f} s old (retention {retention_s:.0f} s)")
    node = rec["node"]
    try:
        node = validate_node_id(node.strip() if isinstance(node, str) else node)
        group = rec.get("group")
        if group is not None:
            group = validate_group_name(group.strip() if isinstance(group, str) else group)
    except NameError_ as exc:
        raise RecordError(exc.reason, exc.detail) from None
    out = {"ts": ts, "node": node, "group": group or None}
    got = _numbers(rec, out, max_latency_ms, max_prompt_tokens, max_completion_tokens)
    prompt, completion = got[_PROMPT], got[_COMPLETION]
    if prompt is None or completion is None:  # latency-only: a lone count was checked, and is dropped
        out[_PROMPT] = out[_COMPLETION] = None
    elif prompt == 0 and completion == 0:
        raise RecordError("no_tokens", "a request with no prompt and no completion tokens carries no signal")
    status = rec.get("status", DEFAULT_STATUS)
    if not status_ok(status):
        raise RecordError("bad_status", f"status must be 0 (timeout/connection failure) or {HTTP_STATUS[0]}..{HTTP_STATUS[1]}, got {str(status)[:40]!r}")
    request_id = rec.get("request_id")
    if not request_id_ok(request_id):
        raise RecordError("bad_request_id",
                          f"request_id must be a printable string of at most {REQUEST_ID_MAX} characters")
    out["status"] = status
    out["request_id"] = request_id or None
    return out
