"""``manage.py scrape_metrics [--shard I/N] [--refresh S] [--metrics-port P]``.

The model-server scraper of one shard, a long-running process (:mod:`outlier_admin.ingest.scraper`):
run one per shard I = 0..N-1, all with the same N (docker-compose service ``scraper``; a second
process of the same shard waits as a hot standby). It serves its own ``outlier_*`` event series
(``outlier_scrape_failures_total``) on ``--metrics-port`` (default ``WORKER_METRICS_PORT``, 0 = off),
bound to ``WORKER_METRICS_BIND``, as a Celery worker does. Stops on SIGTERM / SIGINT.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from outlier_admin.ingest.scraper import parse_shard, serve


class Command(BaseCommand):
    help = "Scrape the model servers' /metrics of one shard of the groups, every METRICS_SCRAPE_INTERVAL_MS."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--shard", default="0/1", help="I/N: the groups with crc32(name) %% N == I (default 0/1)")
        parser.add_argument("--refresh", type=float, default=10.0, help="re-read the node list every S seconds")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="serve this process's /metrics here (default WORKER_METRICS_PORT; 0 = off)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            shard = parse_shard(opts["shard"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not 1.0 <= opts["refresh"] <= 3600.0:
            raise CommandError("--refresh: 1 to 3600 seconds")
        port = settings.WORKER_METRICS_PORT if opts["metrics_port"] is None else opts["metrics_port"]
        if not 0 <= port <= 65535:
            raise CommandError("--metrics-port: 0 to 65535")
        if port:
            from outlier_admin.observability import worker_metrics

            worker_metrics.start(port, settings.WORKER_METRICS_BIND)
        self.stdout.write(f"scraping shard {shard[0]}/{shard[1]} every {settings.METRICS_SCRAPE_INTERVAL_MS} ms")
        stats = serve(shard, refresh_s=opts["refresh"])
        self.stdout.write(f"stopped: {stats.scrapes} scrapes, {stats.rows} rows, failures {stats.failures}")
