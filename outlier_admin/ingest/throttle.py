"""Per-token limits on ingest: one gateway (or one stolen token) cannot take every ingest worker.

Issue 36, finding 3: eight threads of one token, each posting 100,000 garbage lines, held every
gunicorn thread, and the dashboard and the API (which shared them) answered in 9-13 s instead of
0.09 s. Ingest now runs in its own gunicorn process group (the proxy routes ``/api/v1/ingest/`` to
it: ``deploy/nginx/nginx.conf``), and within it each token has

- at most ``INGEST_TOKEN_CONCURRENCY`` requests in progress (default 2: a shipper sends one batch at a
  time per connection, and two gateways sharing a token still overlap), and
- a byte rate, ``INGEST_TOKEN_BYTES_PER_S`` (default 16 MiB/s, ~100,000 records a second) with a
  bucket of ``INGEST_TOKEN_BURST_BYTES`` (at least one full body, so any legal body gets through).

Over either: 429 with ``Retry-After`` (1 s for a slot; the refill time for bytes) in the API's problem
format, counted per token and limit in ``outlier_ingest_throttled_total``. A refused request costs a
token lookup and one Redis call: its body is never parsed. Both limits are shared by every ingest
process and pod (Redis, :mod:`outlier_admin.control.buckets`); a lease is held at most the gunicorn
worker timeout, so a killed worker's slot comes back by itself.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from django.conf import settings

from contract import keys
from outlier_admin.control import buckets

#: Seconds a lease is kept when its request never ends (the worker was killed): past gunicorn's timeout.
LEASE_TTL_S = 60


class Throttled(Exception):
    """A request over one of its token's limits: ``limit`` is ``concurrency`` or ``bytes``."""

    def __init__(self, limit: str, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.limit = limit
        self.detail = detail
        self.retry_after_s = retry_after_s


def _count(token_name: str, limit: str) -> None:
    try:
        from outlier_admin.observability import metrics

        metrics.INGEST_THROTTLED.labels(token_name[:100], limit).inc()
    except Exception:  # a metrics fault never turns a 429 into a 500
        pass


@contextlib.contextmanager
def request_slot(token_id: int, token_name: str) -> Iterator[None]:
    """Hold one of the token's ``INGEST_TOKEN_CONCURRENCY`` slots while the body is handled, or raise
    :class:`Throttled`."""
    limit = settings.INGEST_TOKEN_CONCURRENCY
    if not limit:
        yield
        return
    key = keys.ingest_inflight(token_id)
    lease = buckets.hold(key, limit=limit, ttl_s=LEASE_TTL_S)
    if lease is None:
        _count(token_name, "concurrency")
        raise Throttled("concurrency", f"this token already has {limit} requests in progress "
                        f"(INGEST_TOKEN_CONCURRENCY={limit}): send the next batch when one is answered", 1)
    try:
        yield
    finally:
        buckets.release(key, lease)


def take_bytes(token_id: int, token_name: str, size: int) -> None:
    """Charge ``size`` body bytes to the token's bucket, or raise :class:`Throttled` (nothing charged)."""
    rate = settings.INGEST_TOKEN_BYTES_PER_S
    if not rate:
        return
    wait_ms = buckets.take(keys.ingest_bytes(token_id), cap=settings.INGEST_TOKEN_BURST_BYTES, rate_per_s=rate,
                           cost=size)
    if wait_ms:
        _count(token_name, "bytes")
        raise Throttled("bytes", f"this token is over its ingest rate of {rate} bytes a second "
                        f"(INGEST_TOKEN_BYTES_PER_S): retry this body later", max(1, math.ceil(wait_ms / 1000)))
