"""``manage.py tail_logs [--source NAME] [--add NAME --path P [--format F] [--group G] [--node-map M]] [--once]``.

Runs the log tailer standalone (without Celery): every ``--interval`` seconds, or once. Prints, per
pass and source, what was accepted (and how much of it latency-only) and every refusal counted by
reason and by the format the line looks like, so a wrong ``--format`` or a log without latency is
seen at once, not in SQL. ``--format`` defaults to ``auto`` (each line's format recognised).
With ``--once``, a pass that found nothing new says so, with the file and the offset it read from
(a second ``--once`` printed nothing at all, which looks like a hang or a wrong path); a missing file
is said on stderr. Without ``--once`` an idle pass stays quiet: it would print every ``--interval``.

Redis or PostgreSQL away (a restart, a failover, a timeout under load) does not end the tailer: the
pass that failed is said on stderr and tried again after a backoff (the interval, doubling up to
:data:`MAX_BACKOFF_S`), from the checkpoint, which only a pass that submitted its lines advances; the
lines read again are accepted once (the pipeline drops duplicates). A tailer that died there was
found in the routers' drill: one ``TimeoutError`` reading from Redis at a load average of 35 stopped
it, and the group got no more samples. With ``--once`` the same failure is a clear error: nothing
past the checkpoint was taken, and running it again reads the lines again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models import QuerySet

from contract.logformats import FORMATS, LABELS, LINE_TOO_LONG, parse_node_map
from outlier_admin.control.actions import ActionError
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.actions import do_save_log_source
from outlier_admin.ingest.models import Checkpoint, IngestSource
from outlier_admin.ingest.pipeline import IngestOutcome
from outlier_admin.ingest.tailer import tail_source
from outlier_admin.outage import DB_OUTAGE_ERRORS

#: The longest wait between two tries while Redis or PostgreSQL is away (a restart takes seconds;
#: a longer wait only delays the samples once it is back).
MAX_BACKOFF_S = 30.0
#: What a pass may meet that the next pass can get past: the stores away, not a bug or bad input.
TRANSIENT = (redis.RedisError, *DB_OUTAGE_ERRORS)


def describe_idle(source: IngestSource, offset: int | None) -> str:
    """The line for a pass that read no new line of ``source``: where it looked, from which offset."""
    where = f"offset {offset}" if offset is not None else "the start"
    return f"{source.name}: no new lines in {source.location} (read from {where}; nothing accepted)"


def describe(name: str, out: IngestOutcome) -> list[str]:
    """The lines ``tail_logs`` prints for one pass over one source."""
    lines = [f"{name}: accepted {out.accepted} ({out.latency_only} latency-only) rejected {out.rejected}"
             + (f" duplicates {out.duplicates}" if out.duplicates else "")]
    for (reason, fmt), n in out.rejected_by_reason.most_common():
        lines.append(f"  rejected {n} {reason}" + (f" (looks like {LABELS[fmt]})" if fmt in LABELS else ""))
    return lines


class Command(BaseCommand):
    help = ("Tail gateway access logs (nginx, Envoy, HAProxy, LiteLLM, OpenAI-style JSON, JSONL; --format auto "
            "recognises each line) into the ingest pipeline.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--source", help="only this source (default: every enabled log source)")
        parser.add_argument("--add", metavar="NAME", help="create/update a log source first")
        parser.add_argument("--path")
        parser.add_argument("--format", choices=sorted(FORMATS), help="log format (default with --add: auto)")
        parser.add_argument("--node-map", help="K=NODE,... or a JSON object: what lines name (HAProxy "
                            "backend/server, an address) -> node address; '*': node of lines naming none")
        parser.add_argument("--group", help="group for records that do not name one")
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--interval", type=float, default=2.0)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["add"]:
            if not opts["path"]:
                raise CommandError("--add needs --path")
            try:
                node_map = parse_node_map(opts["node_map"]) if opts["node_map"] else {}
            except ValueError as exc:
                raise CommandError(f"--node-map: {exc}") from None
            group = ModelGroup.objects.filter(name=opts["group"]).first() if opts["group"] else None
            if opts["group"] and group is None:
                # Ingest never creates groups: a typo here would otherwise reject every line later.
                raise CommandError(f"group {opts['group']!r} does not exist; create it first")
            try:
                do_save_log_source(opts["add"], path=opts["path"], log_format=opts["format"] or "auto",
                                   group=group, node_map=node_map, actor="cli:tail_logs",
                                   reason="manage.py tail_logs --add")
            except ActionError as exc:
                raise CommandError(str(exc)) from None
        sources = IngestSource.objects.filter(kind="log", enabled=True).select_related("default_group")
        if opts["source"] or opts["add"]:
            sources = sources.filter(name=opts["source"] or opts["add"])
        if not sources.exists():
            raise CommandError("no enabled log source (create one with --add NAME --path P --format F)")
        if opts["once"]:
            try:
                self.one_pass(sources, once=True)
            except TRANSIENT as exc:
                raise CommandError(f"{type(exc).__name__}: {exc}. Nothing past the checkpoint was taken: run it "
                                   "again once Redis and PostgreSQL answer.") from None
            return
        follow(lambda: self.one_pass(sources, once=False), opts["interval"], self.stderr.write)

    def one_pass(self, sources: QuerySet[IngestSource], *, once: bool) -> None:
        for source in sources.all():  # read afresh every pass: a source disabled meanwhile is left out
            out = tail_source(source)
            if out.accepted or out.rejected or out.duplicates:
                for line in describe(source.name, out):
                    self.stdout.write(line)
            elif once:
                if os.path.exists(source.location):
                    # A pass that read no complete line leaves the checkpoint where it started reading
                    # (0 after a rotation or truncation), so the checkpoint is the offset it read from.
                    offset = Checkpoint.objects.filter(source=source).values_list("offset", flat=True).first()
                    self.stdout.write(describe_idle(source, offset))
                else:
                    self.stderr.write(f"{source.name}: {source.location}: no such file (nothing read)")
            if out.rejected_by_reason.get((LINE_TOO_LONG, "")):  # the skip is said where it happened
                error = IngestSource.objects.filter(pk=source.pk).values_list("last_error", flat=True).first()
                self.stderr.write(f"{source.name}: {error}")


def follow(one_pass: Callable[[], None], interval_s: float, say: Callable[[str], Any], *,
           passes: int | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Run ``one_pass`` every ``interval_s`` (``passes`` times, or for ever); a pass that meets
    :data:`TRANSIENT` is said through ``say`` and tried again after a backoff (module docstring).
    Returns how many passes failed."""
    failed, wait, k = 0, interval_s, 0
    while passes is None or k < passes:
        k += 1
        try:
            one_pass()
        except TRANSIENT as exc:
            failed += 1
            if isinstance(exc, DB_OUTAGE_ERRORS):
                connection.close()  # a broken PostgreSQL connection is not reused by the next pass
            wait = min(wait * 2, MAX_BACKOFF_S)
            say(f"tail_logs: the pass failed ({type(exc).__name__}: {exc}); trying again in {wait:g} s from the "
                "checkpoint (nothing past it was taken)")
        else:
            wait = interval_s
        sleep(wait)
    return failed
