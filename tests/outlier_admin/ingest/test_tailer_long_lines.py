"""Issue 29 finding 7: a line over logformats.MAX_LINE_BYTES (before: one wider than a read, 8 MiB)
stopped its source for good, silently. Now it is skipped to its newline unread, counted as
``line_too_long``, said in ``last_error``, and the lines after it are read."""

from __future__ import annotations

import time

import orjson
import pytest

from contract import keys
from contract.logformats import LINE_TOO_LONG, MAX_LINE_BYTES
from outlier_admin.ingest.models import Checkpoint, IngestSource, RejectedInput
from outlier_admin.ingest.tailer import tail_source

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def line(node="127.0.0.1:9001", **kw) -> bytes:
    rec = {"ts": time.time(), "node": node, "group": "g", "prompt_tokens": 10, "completion_tokens": 5,
           "total_ms": 100.0, "status": 200, **kw}
    return orjson.dumps(rec) + b"\n"


def passes(src: IngestSource, n: int = 4) -> tuple[int, int]:
    accepted = rejected = 0
    for _ in range(n):
        out = tail_source(IngestSource.objects.get(pk=src.pk))
        accepted, rejected = accepted + out.accepted, rejected + out.rejected
    return accepted, rejected


def test_a_9_mib_line_between_good_lines_is_skipped_counted_and_said(tmp_path, redis_client, make_group):
    make_group("g")
    path = tmp_path / "access.log"
    huge = b'{"node": "127.0.4.3:18950", "ua": "' + b"a" * (9 * 1024 * 1024) + b'"}\n'
    path.write_bytes(line(request_id="before") + huge + line(request_id="after-1") + line(request_id="after-2"))
    src = IngestSource.objects.create(name="gw", kind="log", location=str(path), log_format="auto")
    out = tail_source(src)
    assert out.rejected_by_reason[(LINE_TOO_LONG, "")] == 1
    src.refresh_from_db()
    assert LINE_TOO_LONG in src.last_error and "9437" in src.last_error  # its size, where it was
    accepted, rejected = out.accepted + passes(src)[0], out.rejected
    assert accepted == 3 and rejected == 1  # the lines after it are read
    assert Checkpoint.objects.get(source=src).offset == path.stat().st_size
    kept = RejectedInput.objects.get(source="log:gw")
    assert kept.reason == LINE_TOO_LONG and kept.raw.startswith('{"node": "127.0.4.3:18950"') and len(kept.raw) <= 200


def test_a_long_line_still_being_written_is_skipped_on_and_never_read_as_lines(tmp_path, redis_client, make_group):
    make_group("g")
    path = tmp_path / "access.log"
    # Its tail, written later, is a whole forged line: it must be skipped with the rest, not read.
    path.write_bytes(line(request_id="first") + b'{"ua": "' + b"x" * (MAX_LINE_BYTES + 10))
    src = IngestSource.objects.create(name="gw2", kind="log", location=str(path), log_format="auto")
    out = tail_source(src)
    assert (out.accepted, out.rejected) == (1, 1)
    with open(path, "ab") as fh:
        fh.write(line(node="127.0.4.3:18950", request_id="forged"))  # the long line's rest, up to its newline
        fh.write(line(request_id="next"))
    accepted, rejected = passes(src)
    assert (accepted, rejected) == (1, 0)  # "next" only: the forged tail was inside the long line
    assert not redis_client.exists(keys.stream("g")) or b"forged" not in b"".join(
        v for _, fields in redis_client.xrange(keys.stream("g")) for v in fields.values())
