"""Issue 29 finding 3: a pushed body costs memory per byte, not per line, and refusals are stored
per reason, not per line.

The probe's body (``{}`` then ``x`` N times, NDJSON) took 396 MiB of worker RSS for N = 100,000
(0.19 MiB of body) and 1,465 MiB for N = 500,000, and stored one row per line. Each size runs in its
own process (``ru_maxrss`` is a high-water mark) through :mod:`bench.ingest_memory`,
against this test's database, with ``INGEST_MAX_LINES`` above N so that the per-line path is taken.
Asserted: the rows and refusals stored, and a generous bound on peak memory per body byte (the
main before this change: ~1,400 bytes of RSS per body byte; now ~10). No wall time is asserted.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from bench.ingest_memory import run
from outlier_admin.ingest.pipeline import SAMPLES_PER_REASON

pytestmark = [pytest.mark.services, pytest.mark.slow]

# RSS growth per body byte: 1,421-1,445 on the main before (a list of tuples, a ParseError, a decoded
# line and a model instance per line); 7-12 after. The bound leaves room for allocator noise.
MAX_BYTES_PER_BODY_BYTE = 150


@pytest.mark.django_db(transaction=True)
def test_the_probe_body_costs_memory_per_byte_and_rows_per_reason(settings, redis_client):
    db = connection.settings_dict
    env = {"DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "REDIS_URL": settings.REDIS_URL}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        small, large = run([100_000, 500_000], max_lines=None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for r in (small, large):
        assert r["status"] == 200, r
        assert r["rejected"] == r["lines"], r  # every line is refused and counted ...
        assert r["refusals_stored"] == r["lines"], r  # ... in the stored counts ...
        assert r["rows_stored"] == 2, r  # ... on one sample per reason: missing_ts ({}), bad_json (x)
        assert r["growth_bytes_per_body_byte"] < MAX_BYTES_PER_BODY_BYTE, r
    assert large["rows_stored"] <= 2 * SAMPLES_PER_REASON
    # Five times the body, far less than five times the memory of the small one plus its body.
    assert large["rss_growth_mib"] < 5 * small["rss_growth_mib"] + 50 * large["body_bytes"] / 2**20
