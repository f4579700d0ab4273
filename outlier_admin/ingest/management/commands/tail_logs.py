"""``manage.py tail_logs [--source NAME] [--add NAME --path P --format F --group G] [--once]``.

Runs the log tailer standalone (without Celery): every ``--interval`` seconds, or once.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.logformats import FORMATS
from outlier_admin.ingest.models import IngestSource
from outlier_admin.ingest.tailer import tail_source


class Command(BaseCommand):
    help = "Tail gateway access logs (Envoy JSON, nginx, JSONL) into the ingest pipeline."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--source", help="only this source (default: every enabled log source)")
        parser.add_argument("--add", metavar="NAME", help="create/update a log source first")
        parser.add_argument("--path")
        parser.add_argument("--format", choices=sorted(FORMATS))
        parser.add_argument("--group", help="group for records that do not name one")
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--interval", type=float, default=2.0)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["add"]:
            if not opts["path"] or not opts["format"]:
                raise CommandError("--add needs --path and --format")
            group = ModelGroup.objects.filter(name=opts["group"]).first() if opts["group"] else None
            if opts["group"] and group is None:
                # Ingest never creates groups: a typo here would otherwise reject every line later.
                raise CommandError(f"group {opts['group']!r} does not exist; create it first")
            IngestSource.objects.update_or_create(
                name=opts["add"],
                defaults={"kind": "log", "location": opts["path"], "log_format": opts["format"],
                          "default_group": group, "enabled": True},
            )
        sources = IngestSource.objects.filter(kind="log", enabled=True).select_related("default_group")
        if opts["source"] or opts["add"]:
            sources = sources.filter(name=opts["source"] or opts["add"])
        if not sources.exists():
            raise CommandError("no enabled log source (create one with --add NAME --path P --format F)")
        while True:
            for source in sources:
                out = tail_source(source)
                if out.accepted or out.rejected:
                    self.stdout.write(f"{source.name}: accepted {out.accepted} rejected {out.rejected}")
            if opts["once"]:
                return
            time.sleep(opts["interval"])
