"""The asyncio model-server scraper (outlier_admin.ingest.scraper): cadence with a dead node, failures
by kind and their bounded rejected input, shards, the lease and the beat round stepping aside. Real
Redis and PostgreSQL; local HTTP servers on 127.0.0.1 stand in for vLLM."""

from __future__ import annotations

import asyncio
from http.server import BaseHTTPRequestHandler

import orjson
import pytest
from django.core.management import CommandError, call_command

from bench.scraper import VARIANTS, _response, start_server_thread, vllm_page
from contract import keys
from detector.engine_metrics import ROW_FIELDS
from harness.records import http_server
from outlier_admin.ingest.scraper import (
    ALIVE_KEY,
    Scraper,
    Target,
    load_targets,
    parse_shard,
    release_lease,
    renew_lease,
    scrape_round,
    shard_of,
)
from outlier_admin.observability.metrics import EVENTS


@pytest.fixture(scope="module")
def page_server():
    """vLLM pages on 127.0.0.1: /n/<i>/metrics answers (counters growing), /dead/<i>/metrics never."""
    pages = [_response(vllm_page(1, step).encode()) for step in range(VARIANTS)]
    ports, stop = start_server_thread(pages)
    yield f"http://127.0.0.1:{ports[0]}"
    stop()


class Plain(BaseHTTPRequestHandler):
    """/up: a /metrics that is not a model server's; /bad: a vLLM page with a value not a number;
    anything else: 500."""

    def do_GET(self):
        body = (b'vllm:inter_token_latency_seconds_sum{model_name="m"} abc\n' if self.path == "/bad"
                else b"# TYPE up gauge\nup 1\n")
        self.send_response(200 if self.path in ("/up", "/bad") else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def plain_server():
    with http_server(Plain) as url:
        yield url


def failures(group: str, node: str, kind: str) -> float:
    return EVENTS.get_sample_value("outlier_scrape_failures_total", {"group": group, "node": node, "kind": kind}) or 0.0


async def run_for(scraper: Scraper, targets: list[Target], seconds: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(scraper.run((0, 1), stop=stop, load=lambda _shard: targets, lease=False))
    await asyncio.sleep(seconds)
    stop.set()
    await task


@pytest.mark.django_db(transaction=True)  # rejected input is written from the scraper's own thread
def test_a_dead_node_never_delays_the_others(page_server, redis_client):
    from outlier_admin.ingest.models import RejectedInput

    healthy = [Target("g", f"127.0.0.1:{8000 + i}", f"{page_server}/n/{i}/metrics") for i in range(3)]
    dead = Target("g", "127.0.0.9:8000", f"{page_server}/dead/0/metrics")
    before = failures("g", dead.node, "timeout")
    # A timeout longer than the period: scrapes in lockstep (one round waiting for its slowest
    # node) would scrape every node once per 0.6 s, 4 times in 2.5 s.
    scraper = Scraper(redis_client, interval_s=0.25, timeout_s=0.6)
    asyncio.run(run_for(scraper, [*healthy, dead], 2.5))

    # 10 slots in 2.5 s at 250 ms: every healthy node is scraped at (nearly) every slot, whatever
    # the dead one does (its own timeouts make it skip two slots of three: ~3 attempts). Lockstep would
    # scrape a healthy node once per dead attempt; the count is read against the dead node's own
    # attempts, not a wall clock, so a loaded host that slows every scrape cannot fail it.
    timeouts = failures("g", dead.node, "timeout") - before
    assert timeouts >= 2 and scraper.stats.failures == {"timeout": timeouts}
    for t in healthy:
        assert scraper.stats.by_node[("g", t.node)] >= timeouts + 2, (t, timeouts)
    assert ("g", dead.node) not in scraper.stats.by_node
    # Kept as rejected input once a minute, not at every failure.
    bad = RejectedInput.objects.get()
    assert (bad.source, bad.reason, bad.raw) == (f"metrics:g/{dead.node}", "scrape_failed", dead.url)
    assert bad.detail.startswith("timeout: no answer within 0.6 s")

    # The rows reached the group's stream, decode and prefill columns (the page's counters grow
    # by 50 tokens at 20 ms and one 2,000-token prefill per request).
    rows = [row for _id, fields in redis_client.xrange(keys.stream("g"))
            for row in orjson.loads(fields[b"progress"])]
    assert len(rows) >= 3 * (timeouts + 1) and {row[0] for row in rows} == {t.node for t in healthy}
    one = dict(zip(ROW_FIELDS, rows[-1], strict=True))
    assert one["tokens"] % 50 == 0 and one["token_ms"] == pytest.approx(one["tokens"] * 20.0)
    assert one["prefills"] >= 1 and one["running"] == 12
    # The previous counters are in Redis for whichever process scrapes next.
    assert redis_client.hlen(keys.itl("g")) == 3


@pytest.mark.django_db
def test_failures_are_counted_by_kind_and_kept_once_per_node_and_kind(page_server, plain_server, redis_client):
    from outlier_admin.ingest.models import RejectedInput

    targets = {
        "http_status": Target("k", "127.0.0.1:1", f"{plain_server}/missing"),
        "unrecognised_engine": Target("k", "127.0.0.1:2", f"{plain_server}/up"),
        "parse": Target("k", "127.0.0.1:6", f"{plain_server}/bad"),
        "connect": Target("k", "127.0.0.1:3", "http://127.0.0.1:9/metrics"),  # nothing listens
        "timeout": Target("k", "127.0.0.1:4", f"{page_server}/dead/1/metrics"),
        "too_large": Target("k", "127.0.0.1:5", f"{page_server}/n/5/metrics"),  # ~40 KB > 20 KB
    }
    before = {kind: failures("k", t.node, kind) for kind, t in targets.items()}
    scraper = Scraper(redis_client, interval_s=0.25, timeout_s=0.3, max_bytes=20_000)
    for _ in range(2):
        assert asyncio.run(scraper.round(list(targets.values()))) == 0
        scraper.keep_rejected()
    for kind, t in targets.items():
        assert failures("k", t.node, kind) - before[kind] == 2, kind
    kept = {r.source: r.detail.split(":")[0] for r in RejectedInput.objects.all()}
    assert kept == {f"metrics:k/{t.node}": kind for kind, t in targets.items()}  # once each, not twice
    assert "not a model server page" in RejectedInput.objects.get(source="metrics:k/127.0.0.1:2").detail
    assert "not a number" in RejectedInput.objects.get(source="metrics:k/127.0.0.1:6").detail


def test_shards_split_the_groups_and_the_spec_is_checked():
    groups = [f"group-{i}" for i in range(200)]
    shards = [{g for g in groups if shard_of(g, 4) == i} for i in range(4)]
    assert set().union(*shards) == set(groups) and sum(map(len, shards)) == 200
    assert all(20 <= len(s) <= 80 for s in shards)  # crc32 spreads them
    assert parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "1", "a/b", "-1/2", "0/0", "0/2000"):
        with pytest.raises(ValueError):
            parse_shard(bad)
    with pytest.raises(CommandError, match="shard"):
        call_command("scrape_metrics", "--shard", "2/2")


@pytest.mark.django_db
def test_load_targets_reads_the_shard_live_nodes_with_a_metrics_url(redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node

    for g in ("alpha", "beta", "gamma", "delta"):
        group = do_create_group(g, actor="t")
        do_register_node(group, "127.0.0.1:8000", actor="t", metrics_url="http://127.0.0.1:8000/metrics")
        do_register_node(group, "127.0.0.1:8001", actor="t")  # no metrics_url
    node = do_register_node(group, "127.0.0.1:8002", actor="t", metrics_url="http://127.0.0.1:8002/metrics")
    node.retired = True
    node.save()
    parts = [load_targets((i, 2)) for i in range(2)]
    assert sorted(t.group for t in parts[0] + parts[1]) == ["alpha", "beta", "delta", "gamma"]
    assert all(shard_of(t.group, 2) == i for i, part in enumerate(parts) for t in part)
    assert {t.node for t in load_targets()} == {"127.0.0.1:8000"}


@pytest.mark.django_db
def test_one_process_per_shard_and_the_beat_round_steps_aside_while_one_runs(page_server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node

    do_register_node(do_create_group("g", actor="t"), "127.0.0.1:8000", actor="t",
                     metrics_url=f"{page_server}/n/7/metrics")
    assert scrape_round() == 0 and redis_client.hlen(keys.itl("g")) == 1  # the beat's round scraped
    assert scrape_round() == 1  # and its second round queued a row

    assert renew_lease(redis_client, (0, 2), "first", 3000)
    assert not renew_lease(redis_client, (0, 2), "standby", 3000)  # waits for the first to go
    assert renew_lease(redis_client, (1, 2), "other-shard", 3000)
    assert redis_client.exists(ALIVE_KEY)
    assert scrape_round() == 0 and redis_client.xlen(keys.stream("g")) == 1  # stepped aside

    release_lease(redis_client, (0, 2), "standby")  # not its lease: nothing happens
    assert not renew_lease(redis_client, (0, 2), "standby", 3000)
    release_lease(redis_client, (0, 2), "first")
    assert renew_lease(redis_client, (0, 2), "standby", 3000)  # taken over


def test_two_processes_on_one_shard_one_scrapes_the_other_stands_by(page_server, redis_client):
    targets = [Target("g", f"127.0.0.1:{8000 + i}", f"{page_server}/n/{20 + i}/metrics") for i in range(2)]
    first, standby = Scraper(redis_client, interval_s=0.25), Scraper(redis_client, interval_s=0.25)

    async def both() -> None:
        stop = asyncio.Event()
        one = asyncio.create_task(first.run((0, 1), stop=stop, load=lambda _s: targets))
        await asyncio.sleep(0.3)  # the first takes the lease
        two = asyncio.create_task(standby.run((0, 1), stop=stop, load=lambda _s: targets))
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.gather(one, two)

    asyncio.run(both())
    assert first.stats.scrapes >= 4 and standby.stats.scrapes == 0 and not standby.active
    assert not redis_client.exists(keys.scraper_lease(0, 1))  # given up at the clean stop
