"""Template filters that turn stored JSON (audit details, evidence) into words, never Python reprs
(``{'token': 3, 'scope': 'api'}``, ``['127.0.0.0/8']``, ``None``)."""

from __future__ import annotations

from typing import Any

from django import template

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
