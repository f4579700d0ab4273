"""Log tailing: checkpoints, partial lines, rotation and truncation, rejected lines kept."""

from __future__ import annotations

import os
import time

import orjson
import pytest

from contract import keys
from outlier_admin.ingest.models import IngestSource, RejectedInput
from outlier_admin.ingest.tailer import tail_source

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def line(node="127.0.0.1:9001", **kw) -> bytes:
    rec = {"ts": time.time(), "node": node, "group": "g", "prompt_tokens": 10, "completion_tokens": 5,
           "total_ms": 100.0, "status": 200, **kw}
    return orjson.dumps(rec) + b"\n"


def test_checkpoint_rotation_truncation(tmp_path, redis_client, make_group):
    make_group("g")
    path = tmp_path / "access.log"
    path.write_bytes(line() + line() + b'{"partial": ')
    src = IngestSource.objects.create(name="gw", kind="log", location=str(path), log_format="jsonl")
    assert tail_source(src).accepted == 2
    assert tail_source(src).accepted == 0  # nothing new; the partial line waits
    with open(path, "ab") as fh:
        fh.write(b'1}\n' + line())
    out = tail_source(src)
    assert (out.accepted, out.rejected) == (1, 1)  # the completed partial line is not a record
    assert RejectedInput.objects.get(source="log:gw").reason == "missing_ts"
    # rotation: the old file gets one more line before the rename
    with open(path, "ab") as fh:
        fh.write(line())
    os.rename(path, str(path) + ".1")
    path.write_bytes(line() + line())
    assert tail_source(src).accepted == 3
    # truncation (copytruncate)
    path.write_bytes(line())
    assert tail_source(src).accepted == 1
    assert redis_client.exists(keys.stream("g"))
