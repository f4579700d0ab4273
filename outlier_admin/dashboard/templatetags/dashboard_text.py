"""Template filters that turn stored JSON (audit details, evidence) into words, never Python reprs
(``{'token': 3, 'scope': 'api'}``, ``['127.0.0.0/8']``, ``None``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def readable(value: Any) -> str:
    """``None`` -> ``none``, ``True`` -> ``yes``, a list -> its items joined by ``, `` (``[]`` ->
    ``none``), a dict -> ``key value; ...``, anything else -> ``str()``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(readable(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{readable_key(k)} {readable(v)}" for k, v in value.items()) if value else "none"
    return str(value)


@register.filter
def readable_key(key: Any) -> str:
    """``expires_at`` -> ``expires at``."""
    return str(key).replace("_", " ")


@register.filter
def elapsed(value: datetime | None) -> str:
    """Time since ``value`` in words, to the second under a minute. Django's ``timesince`` says
    "0 minutes" for anything under one, which reads as "nothing happened" on a node cut 40 s ago."""
    if value is None:
        return "–"
    seconds = (timezone.now() - value).total_seconds()
    if seconds < 60:
        return f"{max(0, int(seconds))} s"
    return timesince(value)


@register.filter
def signal_unit_of(transition: Any) -> str:
    """The unit of a transition's EMA and baseline (its signal's, :func:`~outlier_admin.dashboard.charts.signal_unit`):
    ``EMA=1.355 baseline=1.003`` next to ms per token read as one scale otherwise."""
    from outlier_admin.dashboard.charts import signal_unit

    return signal_unit(transition.signal or "norm", transition.group.thresholds())


@register.filter
def state_icon(state: str) -> str:
    """The glyph of a state (:data:`outlier_admin.dashboard.tables.STATE_ICONS`), so a state is never
    told by colour alone."""
    from outlier_admin.dashboard.tables import STATE_ICONS

    return STATE_ICONS.get(state, "○")


@register.filter
def incident_cause(incident: Any) -> str:
    """An incident's deciding cause with its signal and units (:func:`outlier_admin.control.incidents.cause_text`)."""
    from outlier_admin.control.incidents import cause_text

    return cause_text(incident)


@register.filter
def duration(incident: Any) -> str:
    """How long an incident lasted (or has lasted), in words."""
    end = incident.ended_at or timezone.now()
    seconds = max(0, int((end - incident.started_at).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s} s"
    return f"{minutes // 60} h {minutes % 60} min"


@register.filter
def proposal_cause(proposal: Any) -> str:
    """A proposal's evidence once, with its signal and units (:func:`outlier_admin.control.incidents.evidence_words`),
    instead of ``EMA=90.423 baseline=57.582``; a GPU proposal's reason as it was written."""
    from detector.signals import unit_of
    from outlier_admin.control.incidents import evidence_words

    e = proposal.evidence or {}
    if not e.get("reason"):
        return proposal.reason
    signal = e.get("signal") or ""
    unit = unit_of(signal, proposal.group.thresholds().normalization) if signal else ""
    return evidence_words(e["reason"], signal, e.get("z"), e.get("ema"), e.get("baseline"), unit)
