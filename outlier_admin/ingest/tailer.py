"""Tail gateway access-log files: complete lines from the checkpoint on, parsed by the source's
format, submitted through :func:`pipeline.submit`, checkpoint advanced after the submit.

Rotation and truncation (``logrotate`` rename or ``copytruncate``):

- the file at ``path`` has another (device, inode) than the checkpoint: it was rotated. The rest
  of the old file is read first when it is found at ``path.1`` (same inode), then the new file
  from offset 0;
- the file is smaller than the checkpoint offset: it was truncated; read from 0.

Only complete lines (ending in ``\\n``) are consumed, so a line being written is read next time. A
line over ``logformats.MAX_LINE_BYTES`` is skipped to its newline without being read, kept as a
``line_too_long`` refusal (its first bytes) and said in the source's ``last_error``; the lines
after it are read (before, such a line wider than a read stopped the source for good, silently).
At most ``max_bytes`` are read per call. The source's ``node_map`` maps what a line names (an
upstream address, HAProxy's ``backend/server``) to a node; see :mod:`contract.logformats`.
"""

from __future__ import annotations

import os
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from contract.logformats import (
    LINE_TOO_LONG,
    MAX_LINE_BYTES,
    ParseError,
    get_parser,
    too_long_error,
)
from outlier_admin.ingest.models import Checkpoint, IngestSource
from outlier_admin.ingest.pipeline import IngestOutcome, submit

MAX_BYTES = 8 * 1024 * 1024
# How far one pass reads through a line over the cap looking for its end; the rest is skipped by
# the next passes (an offset whose previous byte is not a newline is inside a line: see _read_lines).
SKIP_BYTES_PER_PASS = 64 * 1024 * 1024
_SAMPLE_BYTES = 200  # what a skipped line keeps as its rejected sample


class _Read:
    """What one read of a file found: the complete lines, where the next read starts, and the lines
    over :data:`MAX_LINE_BYTES` skipped unread (their first bytes and length)."""

    def __init__(self, offset: int) -> None:
        self.lines: list[bytes | ParseError] = []
        self.skipped: list[tuple[int, str]] = []  # (offset of the line, what last_error says)
        self.offset = offset


def _skip_to_newline(fh: Any, offset: int) -> tuple[int, bool]:
    """From ``offset`` (inside a line), the offset after the line's newline (True) or where the
    scan stopped, at the end of the file or after :data:`SKIP_BYTES_PER_PASS` (False)."""
    fh.seek(offset)
    scanned = 0
    while scanned < SKIP_BYTES_PER_PASS:
        block = fh.read(1024 * 1024)
        if not block:
            return offset + scanned, False
        end = block.find(b"\n")
        if end >= 0:
            return offset + scanned + end + 1, True
        scanned += len(block)
    return offset + scanned, False


def _read_lines(path: str, offset: int, max_bytes: int) -> _Read:
    """The complete lines from ``offset`` (at most ``max_bytes``). A line over
    :data:`MAX_LINE_BYTES` is never read whole: it becomes a ``line_too_long`` refusal holding its
    first bytes, and the offset moves past it, or, while it is still being written, to the end of the
    file. A checkpoint is always just after a newline, so an offset whose previous byte is not one is
    inside such a line, and the next read goes on skipping it to its newline instead of reading its
    rest as a line of its own (a client's text inside a field could be a whole forged line)."""
    out = _Read(offset)
    with open(path, "rb") as fh:
        if offset > 0:
            fh.seek(offset - 1)
            if fh.read(1) != b"\n":
                out.offset, done = _skip_to_newline(fh, offset)
                if not done:
                    return out
        fh.seek(out.offset)
        chunk = fh.read(max_bytes)
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if end - start > MAX_LINE_BYTES:
                out.lines.append(_too_long(chunk[start:start + _SAMPLE_BYTES], end - start))
                out.skipped.append((out.offset + start, f"a line of {end - start} bytes"))
            else:
                out.lines.append(chunk[start:end])
            start = end + 1
        base = out.offset
        if len(chunk) - start > MAX_LINE_BYTES:  # the unfinished last line is already too long
            line_at = base + start
            out.lines.append(_too_long(chunk[start:start + _SAMPLE_BYTES], f"over {len(chunk) - start}"))
            out.offset, done = _skip_to_newline(fh, base + len(chunk))
            out.skipped.append((line_at, f"a line of over {out.offset - line_at} bytes"
                                + ("" if done else " (not finished: skipped on as it is written)")))
        else:
            out.offset = base + start
    return out


def _too_long(sample: bytes, size: int | str) -> ParseError:
    exc = too_long_error(size)
    exc.sample = sample.decode("utf-8", "replace")  # type: ignore[attr-defined]
    return exc


def _submit_lines(source: IngestSource, lines: list[bytes | ParseError], node_map: dict[str, str] | None
                  ) -> IngestOutcome:
    parse = get_parser(source.log_format)
    items: list[tuple[int, Any, str | None]] = []
    for i, raw in enumerate(lines):
        if isinstance(raw, ParseError):  # a line over the cap, skipped unread
            items.append((i + 1, raw, getattr(raw, "sample", "")))
            continue
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
    skipped: list[str] = []
    read_any = False
    for file_path, from_offset in reads:
        read = _read_lines(file_path, from_offset, max_bytes)
        if read.lines:
            read_any = True
            total.add(_submit_lines(source, read.lines, node_map))
        skipped += [f"{file_path}: {what} at offset {at}, over the {MAX_LINE_BYTES}-byte limit of a line: skipped "
                    f"({LINE_TOO_LONG})" for at, what in read.skipped]
        if file_path == path:
            offset = read.offset
    # A skipped line is said in last_error until a later pass reads lines again without one.
    error = {"last_error": "; ".join(skipped)[:2000]} if skipped else {"last_error": ""} if read_any else {}
    with transaction.atomic():
        Checkpoint.objects.filter(pk=cp.pk).update(
            path=path, device=st.st_dev, inode=st.st_ino, offset=offset, updated_at=timezone.now()
        )
        IngestSource.objects.filter(pk=source.pk).update(
            last_ok_at=timezone.now(), **error,
            # F(): the row's own count, not the one this ``source`` object was read with (a long-running
            # tailer reads its sources once; counting from that copy set the total back every pass).
            accepted_total=F("accepted_total") + total.accepted,
            rejected_total=F("rejected_total") + total.rejected,
        )
    return total


def tail_all() -> dict[str, int]:
    """One pass over every enabled log source; returns accepted counts by source name."""
    out = {}
    for source in IngestSource.objects.filter(kind="log", enabled=True).select_related("default_group"):
        out[source.name] = tail_source(source).accepted
    return out
