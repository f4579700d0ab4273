"""The demo without a reachable Redis runs on fakeredis: the threshold preview's rate limiter (a Lua
script) must run there too (it answered "the preview's rate limiter (Redis) is unreachable:
ResponseError" on every preview of such a demo)."""

from __future__ import annotations

from outlier_admin.control import redis_conn
from outlier_admin.demo.runner import choose_redis
from outlier_admin.history.preview import take_token


def test_the_demos_redis_stand_in_runs_the_previews_rate_limiter(settings):
    client, described = choose_redis("redis://127.0.0.1:1/0")  # nothing listens on port 1
    assert "fakeredis" in described
    settings.PREVIEW_BURST, settings.PREVIEW_REFILL_S = 2, 20
    redis_conn.set_redis(client)
    try:
        assert [take_token(7), take_token(7)] == [0, 0]
        assert 0 < take_token(7) <= 20_000  # the bucket is empty: milliseconds until a token is back
    finally:
        redis_conn.set_redis(None)
