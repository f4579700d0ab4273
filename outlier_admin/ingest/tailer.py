"""Tail gateway access-log files: complete lines from the checkpoint on, parsed by the source's
format, submitted through :func:`pipeline.submit`, checkpoint advanced after the submit.

Rotation and truncation (``logrotate`` rename or ``copytruncate``):

- the file at ``path`` has another (device, inode) than the checkpoint: it was rotated. The rest
  of the old file is read first when it is found at ``path.1`` (same inode), then the new file
  from offset 0;
- the file is smaller than the checkpoint offset: it was truncated; read from 0.

Only complete lines (ending in ``\\n``) are consumed, so a line being written is read next time.
At most ``max_bytes`` are read per call. The source's ``node_map`` maps what a line names (an
upstream address, HAProxy's ``backend/server``) to a node; see :mod:`outlier_admin.ingest.logformats`.
"""

from __future__ import annotations

import os
from typing import Any

from django.db import transaction
from django.utils import timezone

from outlier_admin.ingest.logformats import ParseError, get_parser
from outlier_admin.ingest.models import Checkpoint, IngestSource
from outlier_admin.ingest.pipeline import IngestOutcome, submit

MAX_BYTES = 8 * 1024 * 1024


def _read_lines(path: str, offset: int, max_bytes: int) -> tuple[list[bytes], int]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(max_bytes)
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset
    return chunk[: end + 1].splitlines(), offset + end + 1


def _submit_lines(source: IngestSource, lines: list[bytes], node_map: dict[str, str] | None) -> IngestOutcome:
    parse = get_parser(source.log_format)
    items: list[tuple[int, Any, str | None]] = []
    for i, raw in enumerate(lines):
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            continue
        try:
            items.append((i + 1, parse(text, node_map=node_map), text))
        except ParseError as exc:
            items.append((i + 1, exc, text))
    group = source.default_group.name if source.default_group else None
    return submit(items, source=f"log:{source.name}", source_ref=source, default_group=group)


def tail_source(source: IngestSource, *, max_bytes: int = MAX_BYTES, node_map: dict[str, str] | None = None) -> IngestOutcome:
    """Read what is new in ``source.location`` since its checkpoint; returns the counts (and the
    refusals by reason). ``node_map``: instead of the source's own."""
    path = source.location
    if node_map is None:
        node_map = source.node_map or None
    total = IngestOutcome()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        IngestSource.objects.filter(pk=source.pk).update(last_error=f"{path}: no such file")
        return total
    cp, _ = Checkpoint.objects.get_or_create(source=source, defaults={"path": path})
    reads: list[tuple[str, int]] = []
    if (cp.device, cp.inode) != (st.st_dev, st.st_ino) and cp.inode:
        rotated = f"{path}.1"
        try:
            old = os.stat(rotated)
            if (old.st_dev, old.st_ino) == (cp.device, cp.inode) and old.st_size > cp.offset:
                reads.append((rotated, cp.offset))
        except FileNotFoundError:
            pass
        start = 0
    else:
        start = 0 if st.st_size < cp.offset else cp.offset
    reads.append((path, start))
    offset = start
    for file_path, from_offset in reads:
        lines, new_offset = _read_lines(file_path, from_offset, max_bytes)
        if lines:
            total.add(_submit_lines(source, lines, node_map))
        if file_path == path:
            offset = new_offset
    with transaction.atomic():
        Checkpoint.objects.filter(pk=cp.pk).update(
            path=path, device=st.st_dev, inode=st.st_ino, offset=offset, updated_at=timezone.now()
        )
        IngestSource.objects.filter(pk=source.pk).update(
            last_ok_at=timezone.now(), last_error="",
            accepted_total=source.accepted_total + total.accepted,
            rejected_total=source.rejected_total + total.rejected,
        )
    return total


def tail_all() -> dict[str, int]:
    """One pass over every enabled log source; returns accepted counts by source name."""
    out = {}
    for source in IngestSource.objects.filter(kind="log", enabled=True).select_related("default_group"):
        out[source.name] = tail_source(source).accepted
    return out
