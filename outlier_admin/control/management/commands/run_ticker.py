"""``python manage.py run_ticker [--id ID] [--seconds S]``: one event-driven tick loop (one process).

Run N of them (any hosts, one Redis) to shard the groups over N processes; see
:class:`outlier_admin.control.scheduling.Ticker` and ``docs/scale.md``."""

from __future__ import annotations

import fnmatch
import os
import signal
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.redis_conn import get_redis
from outlier_admin.control.scheduling import Ticker, all_groups


class Command(BaseCommand):
    help = "Run an event-driven tick loop over this process's share of the groups."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--id", default="", help="ticker id (default: host:pid)")
        parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
        parser.add_argument("--match", default="", help="only groups whose name matches this glob (default: all); "
                            "tickers sharing a Redis must use the same --match, or groups go unticked")

    def handle(self, *args: Any, **opts: Any) -> None:
        ticker_id = opts["id"] or f"{socket.gethostname()}:{os.getpid()}"
        if len(ticker_id) > 200 or not ticker_id.isprintable():
            raise CommandError("--id must be printable and at most 200 characters")
        seconds = opts["seconds"]
        if seconds is not None and not 0 < seconds <= 30 * 86400:
            raise CommandError("--seconds must be in (0, 2592000]")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"ticker {ticker_id} started")
        pattern = opts["match"]
        if len(pattern) > 200 or not pattern.isprintable():
            raise CommandError("--match must be printable and at most 200 characters")
        list_groups = None
        if pattern:
            def list_groups() -> list[str]:
                return [g for g in all_groups() if fnmatch.fnmatchcase(g, pattern)]
        Ticker(ticker_id, get_redis(), list_groups=list_groups).run(stop, seconds=seconds)
