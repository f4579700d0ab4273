"""The request record's contract: every field, its type and its bounds, in one table.

A record is one finished request as a gateway saw it. Three places check records, and all three read
this table: ``contract.normalize.normalize`` (one record, with a reason code per refusal),
``outlier_admin.ingest.columns.normalize_many`` (a batch, column by column) and
:func:`detector.samples.validate` (the detector's batch, which also takes the simulator's). A record
accepted by ingest is therefore never refused by the detector, and a bound changed here changes in
all three.

=====================  =====  ========  =====================  ==========================  ===========
field                  type   required  least                  most                        0 allowed
=====================  =====  ========  =====================  ==========================  ===========
``ts``                 float  yes       (ingest: now - retention) (ingest: now + max_future)  —
``node``               str    yes       a node id (``contract.names``)
``group``              str    no        a group name
``prompt_tokens``      int    no        0                      ``max_prompt_tokens``       —
``completion_tokens``  int    no        0                      ``max_completion_tokens``   —
``cached_tokens``      int    no        0                      ``prompt_tokens``           —
``ttft_ms``            float  no        :data:`MIN_LATENCY_MS`  ``total_ms``                yes
``queue_ms``           float  no        :data:`MIN_LATENCY_MS`  ``ttft_ms``                 yes
``total_ms``           float  yes       :data:`MIN_LATENCY_MS`  ``max_latency_ms``          —
``status``             int    no (200)  100                    599                         yes
``request_id``         str    no        printable, at most :data:`REQUEST_ID_MAX` characters
=====================  =====  ========  =====================  ==========================  ===========

A bound named ``max_*`` is one of :class:`Limits` (the ``INGEST_*`` settings); a bound naming another
field is that field's value (cached tokens are a part of the prompt, the wait for a batch slot a part
of TTFT, TTFT a part of the total). ``cached_tokens`` is only read with both token counts
(:data:`TOKENS`: a record without both is latency-only), ``queue_ms`` only with ``ttft_ms``
(:attr:`Field.needs`). A TTFT past the total is refused as ``total_below_ttft`` (:attr:`Field.over`),
every other value out of bounds as ``bad_<field>``. Plain Python (no numpy): the log parsers
that import ``contract.normalize`` run on gateway hosts with redis-py only; the bound
checks (:meth:`Field.within`) use operators only, so the same expression judges a number and a numpy
column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The smallest latency a record may carry (ms): 1 µs. No gateway's clock is finer (nginx, HAProxy
#: and Envoy log whole milliseconds; JSON loggers microseconds), so a smaller positive value is not a
#: measurement. The detector averages latencies as logarithms (a pooled geometric mean per node and
#: tick): ``total_ms: 1e-300`` weighs ln(1e-300) = -691 against a healthy request's ln(900) = 6.8. The
#: floor keeps ln(latency) within [-6.9, 15.1] (up to the default ``max_latency_ms``, 1 h).
#: ``ttft_ms`` and ``queue_ms`` may also be exactly 0 (below the gateway's resolution: a header sent
#: within the millisecond, no wait for a batch slot); the detector skips a zero.
MIN_LATENCY_MS = 0.001
#: A record's status: 0 (the client gave up, or no answer) or an HTTP status in this range.
HTTP_STATUS = (100, 599)
DEFAULT_STATUS = 200
REQUEST_ID_MAX = 200


@dataclass(frozen=True)
class Limits:
    """The operator-set bounds (the ``INGEST_*`` settings; these defaults are theirs): how far in the
    future or the past a ``ts`` may be (s), the longest latency (1 h: no gateway holds a request
    longer) and the largest token counts (10 M prompt tokens, the largest context windows served
    today; 1 M completion tokens)."""

    max_future_s: int = 300
    retention_s: int = 3600
    max_latency_ms: int = 3_600_000
    max_prompt_tokens: int = 10_000_000
    max_completion_tokens: int = 1_000_000

    def as_kwargs(self) -> dict[str, float]:
        return {"max_future_s": self.max_future_s, "retention_s": self.retention_s,
                "max_latency_ms": self.max_latency_ms, "max_prompt_tokens": self.max_prompt_tokens,
                "max_completion_tokens": self.max_completion_tokens}


#: No operator-set upper bound: what the detector applies when it is not told the ingest settings
#: (every record that reached it passed them already; the simulator's never exceed the defaults).
_INF: Any = float("inf")
UNLIMITED = Limits(max_future_s=_INF, retention_s=_INF, max_latency_ms=_INF, max_prompt_tokens=_INF,
                   max_completion_tokens=_INF)


@dataclass(frozen=True)
class Field:
    """One numeric field of a record and its bounds (see the module's table)."""

    name: str
    kind: type  # int or float
    required: bool = False
    low: float = 0.0
    #: A number, a :class:`Limits` attribute (``max_...``) or another field's name.
    high: float | str = float("inf")
    #: 0 is accepted below ``low`` (status 0: no answer; a latency under the gateway's resolution).
    zero_ok: bool = False
    #: Read only when these fields are given too (each earlier in :data:`FIELDS`).
    needs: tuple[str, ...] = ()
    #: The reason code of a value within its own bounds but above the field ``high`` names, when that
    #: rule has a name of its own (``total_below_ttft``); otherwise such a value is ``bad_<name>``.
    over: str | None = None

    @property
    def bounded_by_field(self) -> bool:
        """Whether ``high`` names another field (not a number, not a :class:`Limits` attribute)."""
        return isinstance(self.high, str) and not self.high.startswith("max_")

    def high_of(self, limits: Limits, values: Mapping[str, Any]) -> Any:
        """The upper bound: a number, the limit it names, or the value of the field it names."""
        if isinstance(self.high, str):
            return values[self.high] if self.bounded_by_field else getattr(limits, self.high)
        return self.high

    def ceiling(self) -> float | str:
        """The bound ``high`` comes to when a field it names is followed to that field's own bound
        (``queue_ms`` <= ``ttft_ms`` <= ``total_ms`` <= ``max_latency_ms``): a number or a limit's name.
        Within it and at most the named field's value is the same as within ``[low, high]`` (the
        named field is within its own bounds, or the record is refused for it)."""
        f = self
        while f.bounded_by_field:
            f = FIELDS[str(f.high)]
        return f.high

    def within(self, x: Any, high: Any) -> Any:
        """``x`` within ``[low, high]`` (or 0 where allowed), integral for an int field: a bool for a
        number, a boolean mask for a numpy column (NaN compares False: out of bounds)."""
        ok = (x >= self.low) & (x <= high)
        if self.zero_ok:
            ok = ok | (x == 0)
        if self.kind is int:
            ok = ok & (x % 1 == 0)
        return ok

    def describe(self) -> str:
        """The bound in words, for a refusal's detail."""
        zero = "0 or " if self.zero_ok else ""
        return f"{zero}in [{self.low:g}, {self.high if isinstance(self.high, str) else format(self.high, 'g')}]"


#: A record's size: both token counts, or neither. A record without both is latency-only (a lone
#: count is checked, then dropped: half a size is no size), and 0 and 0 carry no signal.
TOKENS = ("prompt_tokens", "completion_tokens")
#: The numeric fields, in the order their rules are checked (a record's first failing rule is its
#: reason): ``ts`` is bounded by the time of ingest (:func:`ts_window`), not here.
FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("prompt_tokens", int, high="max_prompt_tokens"),
    Field("completion_tokens", int, high="max_completion_tokens"),
    Field("cached_tokens", int, high="prompt_tokens", needs=TOKENS),
    Field("total_ms", float, required=True, low=MIN_LATENCY_MS, high="max_latency_ms"),
    Field("ttft_ms", float, low=MIN_LATENCY_MS, high="total_ms", zero_ok=True, over="total_below_ttft"),
    Field("queue_ms", float, low=MIN_LATENCY_MS, high="ttft_ms", zero_ok=True, needs=("ttft_ms",)),
    Field("status", int, low=HTTP_STATUS[0], high=HTTP_STATUS[1], zero_ok=True),
)}
PROMPT, COMPLETION, CACHED = FIELDS["prompt_tokens"], FIELDS["completion_tokens"], FIELDS["cached_tokens"]
TOTAL, TTFT, QUEUE, STATUS = FIELDS["total_ms"], FIELDS["ttft_ms"], FIELDS["queue_ms"], FIELDS["status"]
#: Every field a record must carry.
REQUIRED = ("ts", "node", "total_ms")


def fields_ok(values: Mapping[str, Any], given: Mapping[str, Any], limits: Limits,
              odd: Mapping[str, Any] | None = None) -> Any:
    """Where every numeric field of :data:`FIELDS` but ``status`` (its own reason) is within its
    bounds: a required field given and good, an optional one absent or good. ``values`` and ``given``
    (and ``odd``: a value that was no plain number) are numpy columns by field name; a field is read
    only with the fields it :attr:`~Field.needs`. The table's rules, cross-field bounds included, for
    a batch (``outlier_admin.ingest.columns``, :func:`detector.samples.validate`); the per-record
    spelling is :func:`contract.normalize.normalize` (a test ties the two)."""
    ok: Any = True
    for name, f in FIELDS.items():
        if f is STATUS:
            continue
        where = given[name]
        for need in f.needs:
            where = where & given[need]
        good = f.within(values[name], f.high_of(limits, values))
        if odd is not None:
            good = ~odd[name] & good
        ok = ok & ((where & good) if f.required else (~where | good))
    return ok


def ts_window(now: float, limits: Limits) -> tuple[float, float]:
    """The ``ts`` a record ingested at ``now`` may carry: ``[now - retention_s, now + max_future_s]``."""
    return now - limits.retention_s, now + limits.max_future_s


def status_ok(value: Any) -> bool:
    """A status the contract accepts: an int (never a bool), 0 or an HTTP status."""
    return not isinstance(value, bool) and isinstance(value, int) and STATUS.within(value, STATUS.high)


def request_id_ok(value: Any) -> bool:
    """A request id the contract accepts: none, or a printable string of at most
    :data:`REQUEST_ID_MAX` characters."""
    return value is None or (isinstance(value, str) and len(value) <= REQUEST_ID_MAX and value.isprintable())


def json_schema(limits: Limits) -> dict[str, dict[str, Any]]:
    """Each numeric field's JSON Schema (OpenAPI 3.0) from :data:`FIELDS`: its type and its bounds,
    the ingest API's schema of a record (``outlier_admin.api.schema``). A bound that names another
    field is given as that field's own upper bound, followed to a number (``queue_ms`` <= ``ttft_ms``
    <= ``total_ms`` <= ``max_latency_ms``): a schema cannot compare two fields, so that rule is said
    in words beside it (:func:`bound_in_words`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, f in FIELDS.items():
        high: Any = f.ceiling()
        high = getattr(limits, high) if isinstance(high, str) else high
        low: Any = int(f.low) if f.kind is int else f.low
        bounds = {"minimum": low} if high == _INF else {"minimum": low, "maximum": high}
        kind = "integer" if f.kind is int else "number"
        out[name] = {"type": kind, "oneOf": [{"enum": [0]}, bounds]} if f.zero_ok and f.low > 0 else {
            "type": kind, **bounds}
    return out


def bound_in_words(name: str) -> str:
    """The rule of a field bounded by another (``"at most `total_ms`"``), or ``""``."""
    f = FIELDS[name]
    return f"at most `{f.high}`" if f.bounded_by_field else ""
