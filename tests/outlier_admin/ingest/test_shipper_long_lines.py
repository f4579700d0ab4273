"""Issue 29 finding 7 on the gateway host: the log shipper's file tail skips a line over
logformats.MAX_LINE_BYTES to its newline unread, counts it (``line_too_long``), says it in
``last_error`` and ships the lines after it; what it holds of an unfinished line stays under the cap."""

from __future__ import annotations

import threading

from agent.shipper import LogShipper, tail_file
from contract.logformats import LINE_TOO_LONG, MAX_LINE_BYTES
from tests.agent.test_shipper import LINE, serve_ingest, wait_for


def test_a_9_mib_line_between_good_lines_is_skipped_and_the_tail_goes_on(tmp_path):
    posts = []

    def take(_auth, records):
        posts.append(records)
        return 200

    log = tmp_path / "access.log"
    log.write_bytes(b"")
    with serve_ingest(take) as url:
        shipper = LogShipper(url, "secret", group="llm", parser="auto")
        stop = threading.Event()
        thread = threading.Thread(target=tail_file, args=(shipper, log, stop),
                                  kwargs={"flush_interval_s": 0.05, "poll_s": 0.01, "start_offset": 0}, daemon=True)
        thread.start()
        try:
            with log.open("ab") as fh:
                fh.write((LINE.format(port=9001, rid="before") + "\n").encode())
                fh.write(b'127.0.0.1 - ' + b"u" * (9 * 1024 * 1024) + b"\n")  # a 9 MiB $remote_user
                fh.write((LINE.format(port=9002, rid="after") + "\n").encode())
            assert wait_for(lambda: shipper.shipped == 2, timeout_s=15)
            # A long line still being written: dropped as it comes, never held whole.
            with log.open("ab") as fh:
                fh.write(b"x" * (MAX_LINE_BYTES + 1))
            assert wait_for(lambda: shipper.rejected_by_reason[LINE_TOO_LONG] == 2, timeout_s=15)
            with log.open("ab") as fh:
                fh.write(b"the rest of the long line\n" + (LINE.format(port=9003, rid="next") + "\n").encode())
            assert wait_for(lambda: shipper.shipped == 3, timeout_s=15)
        finally:
            stop.set()
            thread.join(timeout=5)
    records = [rec for body in posts for rec in body]
    assert [r["request_id"] for r in records] == ["before", "after", "next"]
    assert shipper.rejected_by_reason == {LINE_TOO_LONG: 2}  # the rest of the long line is not a line
    assert "limit of a log line" in shipper.last_error
    assert shipper.rejected[0][0] == LINE_TOO_LONG and shipper.rejected[0][1].startswith("127.0.0.1 - uuu")
