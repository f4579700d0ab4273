"""``manage.py tail_logs --once`` run again with nothing new in the log printed nothing at all (a hang,
a wrong path?): it now says there were no new lines, in which file and from which offset."""

from __future__ import annotations

import io
import time

import orjson
import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def line(**kw) -> bytes:
    rec = {"ts": time.time(), "node": "127.0.0.1:9001", "group": "g", "prompt_tokens": 10, "completion_tokens": 5,
           "total_ms": 100.0, "status": 200, **kw}
    return orjson.dumps(rec) + b"\n"


def tail_once(*argv: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("tail_logs", *argv, "--once", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_second_once_with_nothing_new_says_so(tmp_path, redis_client, make_group):
    make_group("g")
    path = tmp_path / "access.log"
    path.write_bytes(line() + line())
    size = path.stat().st_size
    first, _ = tail_once("--add", "edge", "--path", str(path), "--format", "jsonl", "--group", "g")
    assert first.splitlines() == ["edge: accepted 2 (0 latency-only) rejected 0"]

    second, err = tail_once("--source", "edge")
    assert second.splitlines() == [f"edge: no new lines in {path} (read from offset {size}; nothing accepted)"]
    assert err == ""

    # A partial line is not a new line yet: the offset stays before it.
    with open(path, "ab") as fh:
        fh.write(b'{"partial": ')
    third, _ = tail_once("--source", "edge")
    assert third.splitlines() == [f"edge: no new lines in {path} (read from offset {size}; nothing accepted)"]


def test_a_missing_file_is_said_on_stderr(tmp_path, redis_client, make_group):
    make_group("g")
    path = tmp_path / "not-yet.log"
    out, err = tail_once("--add", "edge", "--path", str(path), "--format", "jsonl", "--group", "g")
    assert out == ""
    assert err.splitlines() == [f"edge: {path}: no such file (nothing read)"]
