"""What the pipeline calls to record events (never raises into the caller: metrics must not break
the control loop).

Each function marks the object it observed (``_observed_by_metrics``), so a result observed twice
(e.g. by the pipeline and by the demo runner that called it) is counted once.

* after a tick: ``observe_tick(result)`` with the :class:`outlier_admin.control.tick.TickResult`
  (a worker's tick: through :data:`outlier_admin.control.signals.tick_done`);
* after an ingest batch: ``observe_ingest(outcome, source=..., rejected_by_reason=...)`` with the
  :class:`outlier_admin.ingest.pipeline.IngestOutcome` (``rejected_by_reason``: exact counts of every
  reject; without it the reasons listed in ``outcome.errors`` are used and the rest counted as
  ``unlisted``); ``source`` is labelled by its kind only (:func:`source_label`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from outlier_admin.observability import metrics

log = logging.getLogger(__name__)
_MARK = "_observed_by_metrics"


def _first_time(obj: Any) -> bool:
    if getattr(obj, _MARK, False):
        return False
    # Slotted/frozen objects cannot be marked: they are counted every time.
    with contextlib.suppress(AttributeError):
        setattr(obj, _MARK, True)
    return True


def observe_tick(result: Any) -> None:
    """Record one tick: duration, decision-to-publish latency, samples applied. ``None`` (tick
    skipped because another worker held the lock) records nothing."""
    if result is None or not _first_time(result):
        return
    try:
        metrics.TICK_DURATION.labels(result.group).observe(result.tick_ms / 1000.0)
        metrics.PUBLISH_LATENCY.labels(result.group).observe(result.publish_latency_ms / 1000.0)
        if result.samples:
            metrics.TICK_SAMPLES.labels(result.group).inc(result.samples)
    except Exception:
        log.exception("could not record tick metrics")


def on_tick_done(sender: Any, result: Any, **kwargs: Any) -> None:
    """:func:`observe_tick` as the receiver of :data:`outlier_admin.control.signals.tick_done`."""
    observe_tick(result)


def observe_ingest(outcome: Any, *, source: str, rejected_by_reason: Mapping[str, int] | None = None) -> None:
    """Record one ingest batch's accepted / duplicate / rejected counts by source and reason."""
    if not _first_time(outcome):
        return
    try:
        source = source_label(source)
        if outcome.accepted:
            metrics.INGEST_RECORDS.labels(source, "accepted").inc(outcome.accepted)
        if outcome.duplicates:
            metrics.INGEST_RECORDS.labels(source, "duplicate").inc(outcome.duplicates)
        if outcome.rejected:
            metrics.INGEST_RECORDS.labels(source, "rejected").inc(outcome.rejected)
            reasons = Counter(rejected_by_reason or {})
            if not reasons:
                reasons = Counter(e["reason"] for e in outcome.errors)
                unlisted = outcome.rejected - sum(reasons.values())
                if unlisted > 0:
                    reasons["unlisted"] += unlisted
            for reason, n in reasons.items():
                metrics.INGEST_REJECTED.labels(source, reason).inc(n)
    except Exception:
        log.exception("could not record ingest metrics")


#: Ingest source label by the kind before the ``:`` of the pipeline's source (``http:<token name>``,
#: ``log:<log source name>``, ``demo-gateway:<group>``); every other source is ``other``.
SOURCE_KINDS = {"http": "http", "log": "logs", "metrics": "scrape", "dcgm": "scrape", "demo-gateway": "demo"}


def source_label(source: str) -> str:
    """The metric label of an ingest source: its kind only, one of a closed set (``http``, ``logs``,
    ``scrape``, ``demo``, ``other``). The name after the kind (a gateway token's, a log source's) is
    chosen by operators, may say more than it should, and is unbounded: one series per token would
    grow the scrape with every token created, and anyone who can read ``/metrics`` would read the
    names. It stays in ``RejectedInput.source`` (SQL, behind the API's roles)."""
    return SOURCE_KINDS.get(source.partition(":")[0], "other")
