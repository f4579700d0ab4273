"""Structured (JSON) logging: one JSON object per line, for log shippers (Loki, Elastic, Cloud Logging).

Pure stdlib (imported by ``settings.py`` before Django is set up). A record becomes::

    {"ts": "2026-01-01T12:00:00.123Z", "level": "INFO", "logger": "outlier_admin.events",
     "message": "transition gpu-07 healthy -> degraded", "event": {...}}

``event`` is whatever the caller passed as ``extra={"event": {...}}`` (transitions, overrides,
alerts); exceptions are rendered under ``exc``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line (never raises: unserialisable values become strings)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            doc["event"] = event
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def logging_config(*, json_logs: bool = True, level: str = "INFO") -> dict[str, Any]:
    """A ``LOGGING`` dict: everything to stderr, JSON (``json_logs``) or plain text.

    ``level`` applies to the project's loggers (``outlier_admin``, ``detector``); Django and Celery
    stay at WARNING so a request log does not drown the transitions.
    """
    level = level.upper()
    if level not in logging.getLevelNamesMapping():
        raise ValueError(f"LOG_LEVEL={level!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
    formatter = "json" if json_logs else "plain"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": "outlier_admin.observability.logconfig.JsonFormatter"},
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        },
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": formatter}},
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {
            "outlier_admin": {"level": level, "propagate": True},
            "detector": {"level": level, "propagate": True},
        },
    }
