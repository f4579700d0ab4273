"""Bounded loopback fault-injection probe of ingest -> stream -> tick: 0 records lost, 0 applied twice.

What it runs (all on 127.0.0.1, all its own, all stopped at the end; temp dirs removed):

- its own PostgreSQL cluster (``initdb`` into a temp dir with the Debian binaries, ``pg_ctl`` on a free
  port, trust auth; as the ``postgres`` user when run as root, since initdb refuses root) and its own
  ``redis-server`` (``--appendonly yes --appendfsync always``, data dir in the temp dir): the shared
  servers on 5432/6379 are never touched;
- ``manage.py migrate``, the groups (``do_create_group(..., auto_register_allow=["127.0.0.0/8"])``)
  and an ingest token (``do_create_token``); ``AUTO_REGISTER_NODES=1`` so loopback nodes register;
- gunicorn with production settings (random ``SECRET_KEY``, ``ALLOWED_HOSTS=127.0.0.1``,
  ``SECURE_SSL_REDIRECT=0`` because loopback has no TLS), two Celery workers (``--pool solo``, separate
  processes) and one separate beat (so killing a worker never stops the schedule);
- gateways (asyncio + httpx in this process): ``--records`` records at ``--rate`` records/s, in
  batches of ``--batch`` to ``--groups`` groups of ``--nodes`` nodes (node ids ``127.0.0.x:port``),
  every record with a unique ``request_id``. Like a real shipper (``agent/shipper.py``)
  a gateway keeps a batch and re-POSTs the *same body* on a 5xx or a connection error until it gets a
  200 or a 4xx; generation is open loop (a backlog builds up during outages and drains after);
- faults on a schedule while the gateways send (times relative to the start of the sending; the
  nominal sending time is ``records / rate``):

  * ``kill -9`` of Redis at 15% (``--redis-kills`` > 1: more, spread over the rest), at a moment a
    tick holds a group's lock, restarted on the same data dir after ``--redis-down-s``;
  * with ``--redis-failovers N``, Redis runs replicated instead (a replica and three Sentinels,
    ``redis+sentinel://``, ``REDIS_MIN_REPLICAS_ACK=1``) and its primary is ``kill -9``'d N times;
    Sentinel promotes the replica, every process follows it, and the dead node comes back
    ``--redis-down-s`` later as a replica of the new primary;
  * the private PostgreSQL stopped (``pg_ctl -m fast``, or ``--pg-stop-mode immediate``) at 40% for
    ``--pg-stop-s``, then started again; at least ``--storage-up-s`` between two storage faults;
  * ``kill -9`` of a Celery worker every ``--worker-kill-every-s``, timed for the middle of a tick (a
    worker is ticking while it runs the lease-renewal thread of a tick lock), restarted after
    ``--worker-restart-s``;
  * optional, off by default: ``kill -9`` of a gunicorn worker every ``--web-kill-every-s`` (answers
    lost after the point of acceptance: the duplicates path), and ``SIGSTOP`` of a ticking Celery
    worker for ``--worker-pause-s`` every ``--worker-pause-every-s`` (a stalled host: its tick lease
    lapses while it holds the group's entries, then it resumes).

At the end the gateways stop, the probe waits until every group's stream is drained (consumer group
``ticks``: no pending entry, nothing left to deliver, and the detector state's ``last_id`` at the
stream's last id), then counts.

What "lost" and "applied twice" mean here
-----------------------------------------
Request ids are unique across the whole run, so within one retried body a ``duplicates`` count in
the final 200 can only mean "these records already landed through an earlier attempt of this same
body" (an attempt whose answer was lost: a connection error or client timeout after the server's
MULTI/EXEC, or a 5xx after it — the contract says a 5xx accepted nothing, so a duplicate after 5xx
answers only is reported apart, as a contract violation, not as a loss; so are duplicates in the
answer to a body's first POST, which only a retry inside the server can produce). Hence:

- *landed* = sum over the batches that got a 200 of ``accepted + duplicates``: each of those records
  is in its group's stream exactly once (the dedup sets, :func:`contract.keys.dedup`, are written in
  the same MULTI as the rows; the probe checks that every landed id is in them and no other id is);
- *applied* = sum over groups of the detector's ``accepted_total`` (detector state in Redis): every
  row the ticks handed to the detector and it accepted. Rows carry no request id, so the detector
  cannot say which records it applied;
- ``lost = landed - applied`` and ``applied_twice = applied - landed`` (each floored at 0), per group
  and in total. Per group a loss and a double application could cancel out; the per-node check
  (records landed per node vs. the node's decode-EMA sample count, exact while no node was reset by
  a recovery from quarantine) would catch that unless they also cancelled within one node.
- ``http_accepted`` (the ``accepted`` of the 200s alone) is reported too: it differs from *landed*
  by exactly the duplicates that came back after a lost answer. Comparing ``applied`` with it alone
  would count every such record as "applied twice".

A batch still without a 200 when the time runs out is *unresolved*: its records may or may not have
landed, which the dedup sets tell; the verdict is then not a pass. So is a stream whose consumer group
has nothing pending or undelivered while the state's ``last_id`` stays behind the stream's last entry
(``--drain-stall-s``): entries acknowledged whose samples are not in the state.

Not a test: no timed assertions. It prints the figures and writes them to ``--out``. Development::

    .venv/bin/python bench/chaos_probe.py --records 20000 --rate 2000 --pg-stop-s 5 \\
        --worker-kill-every-s 5 --out reports/chaos-probe-small.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runs as a script too

from bench.chaos.cluster import Cluster, _log_summary  # noqa: E402
from bench.chaos.load import run  # noqa: E402
from bench.chaos.report import _summary  # noqa: E402

# ------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000, help="records sent in all (default 400000)")
    ap.add_argument("--rate", type=float, default=4000.0, help="records per second generated (default 4000)")
    ap.add_argument("--batch", type=int, default=250, help="records per POST (default 250)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=16, help="nodes per group")
    ap.add_argument("--senders", type=int, default=8, help="concurrent gateway senders")
    ap.add_argument("--pg-stop-s", type=float, default=30.0, help="seconds PostgreSQL stays stopped (0: no stop)")
    ap.add_argument("--pg-stop-mode", choices=["fast", "immediate"], default="fast",
                    help="pg_ctl stop mode: fast (clean) or immediate (crash, recovery on start)")
    ap.add_argument("--redis-down-s", type=float, default=5.0, help="seconds between Redis kill -9 and restart")
    ap.add_argument("--redis-kills", type=int, default=1, help="how many times Redis is killed (0: never)")
    ap.add_argument("--redis-failovers", type=int, default=0,
                    help="run Redis with a replica and three Sentinels (redis+sentinel://, REDIS_MIN_REPLICAS_ACK=1) "
                         "and kill -9 the primary this many times (then --redis-kills is 0)")
    ap.add_argument("--storage-up-s", type=float, default=None,
                    help="minimum seconds of service between two Redis/PostgreSQL faults "
                         "(default: 10, or 10%% of the nominal sending time if less)")
    ap.add_argument("--worker-kill-every-s", type=float, default=20.0, help="kill -9 a Celery worker this often (0: never)")
    ap.add_argument("--web-kill-every-s", type=float, default=0.0,
                    help="also kill -9 a gunicorn worker this often (0, the default: never)")
    ap.add_argument("--worker-pause-every-s", type=float, default=0.0,
                    help="also SIGSTOP a ticking worker this often (0, the default: never)")
    ap.add_argument("--worker-pause-s", type=float, default=8.0,
                    help="seconds a paused worker stays stopped (beyond TICK_LOCK_TTL_MS: its lease lapses)")
    ap.add_argument("--worker-restart-s", type=float, default=3.0, help="seconds before a killed worker restarts")
    ap.add_argument("--drain-stall-s", type=float, default=60.0,
                    help="stop waiting for the drain when the streams and states have not moved for this long")
    ap.add_argument("--timeout", type=float, default=1200.0, help="overall bound (seconds) of the whole probe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-logs", default=None, help="copy the children's logs to this directory at the end")
    ap.add_argument("--out", default="reports/chaos-probe.json")
    args = ap.parse_args()
    if args.redis_failovers > 0:
        args.redis_kills = 0  # the single-Redis kill and the failover are different set-ups
    deadline = time.monotonic() + args.timeout

    # SIGTERM -> SystemExit so the finally below still stops everything we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = Cluster(args.keep_logs)
    figures: dict[str, Any] = {}
    try:
        figures = run(cluster, args, deadline)
    except Exception:  # still report (and clean up): a probe that broke is a finding too
        figures = {"verdict": "ERROR", "error": traceback.format_exc()[-4000:]}
    finally:
        with contextlib.suppress(Exception):
            figures.setdefault("logs", _log_summary(cluster))
        cluster.close()
    print(json.dumps(figures, indent=2))
    print(_summary(figures))
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures.get("verdict") == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
