"""Liveness and readiness checks (plain functions; the views only render them)."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection


def check_database() -> dict[str, Any]:
    """``{"ok": bool, "ms": float, "error"?: str}`` after ``SELECT 1`` on the default database."""
    started = time.perf_counter()
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()
    except Exception as exc:  # any driver error means "not ready"; the message says which
        return {"ok": False, "ms": _ms(started), "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": _ms(started)}


def check_redis() -> dict[str, Any]:
    """``{"ok": bool, "ms": float, "error"?: str}`` after ``PING`` on the control plane's Redis."""
    from outlier_admin.control.redis_conn import get_redis

    started = time.perf_counter()
    try:
        get_redis().ping()
    except Exception as exc:
        return {"ok": False, "ms": _ms(started), "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": _ms(started)}


def readiness() -> tuple[bool, dict[str, Any]]:
    """Ready when both the database and Redis answer: ``(ready, {"database": ..., "redis": ...})``."""
    checks = {"database": check_database(), "redis": check_redis()}
    return all(c["ok"] for c in checks.values()), checks


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 2)
