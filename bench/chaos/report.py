"""The chaos probe's report: the accounting of every id sent against what the control plane applied
(:mod:`bench.chaos.readback`), the figures and the one-line verdict (:func:`_summary`)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.chaos.cluster import Cluster
from bench.chaos.readback import dedup_ids
from bench.chaos.records import Batch, HttpStats, batch_ids

if TYPE_CHECKING:  # annotations only
    from bench.chaos.faults import Monitor

def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _fault_windows(faults: list[dict[str, Any]], failures: list[float], t0_wall: float) -> None:
    """Client-side view of each storage fault: first and last non-200 answer within it (+10 s)."""
    for f in faults:
        if f.get("lasted_s") is None or f["fault"] == "worker_kill_9":
            continue
        start = t0_wall + f["at_s"]
        end = start + f["lasted_s"] + 10
        hits = [t for t in failures if start <= t <= end]
        f["client_failures"] = len(hits)
        f["client_failure_span_s"] = round(hits[-1] - hits[0], 2) if hits else 0.0


def _by_group(groups: list[str], resolved: list[Batch], applied: dict[str, int]
              ) -> tuple[dict[str, dict[str, int]], int, Counter[str], bool]:
    """Per group, what landed (accepted + duplicates of the batches answered 200) against what its
    detector applied: ``lost`` is landed - applied, ``applied_twice`` the reverse. Also the total landed,
    what landed per node, and whether that count is exact (a batch with rejected records does not say
    whose they were)."""
    landed_by_group: Counter[str] = Counter()
    http_accepted_by_group: Counter[str] = Counter()
    landed_by_node: Counter[str] = Counter()
    exact_nodes = True
    for b in resolved:
        landed_by_group[b.group] += b.accepted + b.duplicates
        http_accepted_by_group[b.group] += b.accepted
        if b.accepted + b.duplicates == b.n:
            landed_by_node.update(b.node_counts)
        else:
            exact_nodes = False  # rejected records: which node's is not in the answer
    by_group = {}
    for g in groups:
        landed, done = landed_by_group[g], applied.get(g, 0)
        by_group[g] = {"landed": landed, "http_accepted": http_accepted_by_group[g], "applied": done,
                       "lost": max(0, landed - done), "applied_twice": max(0, done - landed)}
    return by_group, sum(landed_by_group.values()), landed_by_node, exact_nodes


def _dedup_check(r: Any, groups: list[str], tag: str, resolved: list[Batch], unresolved: list[Batch]
                 ) -> dict[str, Any]:
    """Which ids are in the dedup sets (= in the stream, exactly once) vs. which got a 200: every
    acknowledged id must be there, and no id of a batch that was never sent."""
    expected: dict[str, set[str]] = {g: set() for g in groups}
    maybe: dict[str, set[str]] = {g: set() for g in groups}
    for b in resolved:
        expected[b.group].update(batch_ids(tag, b))
    for b in unresolved:
        maybe[b.group].update(batch_ids(tag, b))
    dedup = {"ids_in_dedup_sets": 0, "acknowledged_ids_missing": 0, "unacknowledged_ids_present": 0,
             "ids_of_unresolved_batches_present": 0, "examples_missing": []}
    for g in groups:
        ids = dedup_ids(r, g)
        dedup["ids_in_dedup_sets"] += len(ids)
        missing = expected[g] - ids
        extra = ids - expected[g]
        dedup["acknowledged_ids_missing"] += len(missing)
        dedup["ids_of_unresolved_batches_present"] += len(extra & maybe[g])
        dedup["unacknowledged_ids_present"] += len(extra - maybe[g])
        dedup["examples_missing"] += sorted(missing)[:5]
    return dedup


def _http(stats: HttpStats, batches: list[Batch], resolved: list[Batch], t0_wall: float) -> dict[str, Any]:
    """The gateways' side: answers, retries, and where the duplicates came from (after a connection
    error is expected; after 5xx answers alone contradicts "a 5xx accepted nothing")."""
    dup_batches = [b for b in resolved if b.duplicates]
    conn_kinds = ("conn:",)
    dup_after_conn = [b for b in dup_batches if any(a.startswith(conn_kinds) for a in b.attempts)]
    dup_after_5xx_only = [b for b in dup_batches if b.attempts and b not in dup_after_conn]
    # Duplicates in the answer to a body's first POST: the server re-ran its own MULTI/EXEC after
    # losing the reply of one that had been applied (redis-py retries a watched transaction).
    dup_first = [b for b in dup_batches if not b.attempts]
    retried = [b for b in batches if b.attempts]
    five = sum(v for k, v in stats.status.items() if k[:1] == "5")
    return {
        "posts": stats.posts,
        "answers": dict(stats.status.most_common()),
        "answers_5xx": five,
        "answers_503": stats.status.get("503", 0),
        "connection_errors": sum(v for k, v in stats.status.items() if k.startswith("conn:")),
        "retries": sum(len(b.attempts) for b in batches),
        "batches_retried": len(retried),
        "max_attempts_of_a_batch": max((len(b.attempts) + 1 for b in batches), default=0),
        "batches_with_duplicates": len(dup_batches),
        "duplicates_after_a_connection_error": sum(b.duplicates for b in dup_after_conn),
        # A 5xx says "nothing was accepted": duplicates after 5xx answers alone contradict it.
        "duplicates_after_5xx_only": sum(b.duplicates for b in dup_after_5xx_only),
        "duplicates_in_a_first_answer": sum(b.duplicates for b in dup_first),
        # [answer, s after the start of the sending the attempt was sent] of each failed attempt
        "examples_dup_after_5xx_only": [
            {"batch": b.no, "group": b.group, "duplicates": b.duplicates,
             "failed_attempts": [[a, round(t - t0_wall, 2)] for a, t in zip(b.attempts, b.attempt_times,
                                                                            strict=True)]}
            for b in dup_after_5xx_only[:3]],
        "post_ms_p50": _pct(stats.post_ms, 50),
        "post_ms_p99": _pct(stats.post_ms, 99),
        "post_ms_max": round(max(stats.post_ms), 1) if stats.post_ms else None,
    }


def _weights(monitor: Monitor, groups: list[str], t0_wall: float) -> dict[str, dict[str, Any]]:
    """Per group, the longest gap between two published documents the poller saw, against the
    document's own ``stale_after_s``: the gateways kept fresh weights through the faults if it stayed under."""
    weights = {}
    for g in groups:
        docs = monitor.docs[g]
        gaps = [(docs[i][2] - docs[i - 1][2], docs[i][2]) for i in range(1, len(docs))]
        gap, gap_at = max(gaps) if gaps else (None, None)
        stale = docs[-1][3] if docs else None
        weights[g] = {
            "documents_seen": len(docs),
            "longest_gap_s": round(gap, 2) if gap is not None else None,
            "longest_gap_ended_at_s": round(gap_at - t0_wall, 1) if gap_at else None,
            "max_age_seen_by_poller_s": round(monitor.max_age[g][0], 2),
            "stale_after_s": stale,
            "stayed_under_stale_after_s": gap is not None and stale is not None and gap < stale,
        }
    return weights


def _records(batches: list[Batch], resolved: list[Batch], refused: list[Batch], unresolved: list[Batch],
             landed: int, applied_total: int, sending_s: float) -> dict[str, Any]:
    """The records' accounting: sent, answered, landed in the streams, applied by the detectors."""
    return {
        "sent": sum(b.n for b in batches),
        "batches": len(batches),
        "http_accepted": sum(b.accepted for b in resolved),
        "http_duplicates_after_lost_answers": sum(b.duplicates for b in resolved),
        "landed": landed,
        "rejected": sum(b.rejected for b in resolved),
        "rejected_examples": [e for b in resolved for e in b.errors][:5],
        "refused_batches_4xx": len(refused),
        "unresolved_batches": len(unresolved),
        "unresolved_records": sum(b.n for b in unresolved),
        "applied_by_detectors": applied_total,
        "delivered_per_s": round(landed / sending_s) if sending_s else None,
    }


def _problems(lost: int, twice: int, unresolved: list[Batch], drained_ok: bool, dedup: dict[str, Any],
              resolved: list[Batch], refused: list[Batch], fault_errors: list[str]) -> list[str]:
    """What makes the verdict FAIL: any record lost, applied twice, left unresolved or rejected, a
    stream not drained, the dedup sets not matching the answers, a fault that could not be injected."""
    return [name for name, bad in [
        ("records lost", lost), ("records applied twice", twice), ("unresolved batches", unresolved),
        ("streams not drained", not drained_ok), ("acknowledged ids missing from the dedup sets",
                                                  dedup["acknowledged_ids_missing"]),
        ("unacknowledged ids in the dedup sets", dedup["unacknowledged_ids_present"]),
        ("rejected records", any(b.rejected for b in resolved)), ("batches refused with a 4xx", refused),
        ("a fault could not be injected", fault_errors),
    ] if bad]


def _report(args: argparse.Namespace, cluster: Cluster, groups: list[str], tag: str, batches: list[Batch],
            stats: HttpStats, applied: dict[str, int], per_node_applied: dict[str, int],
            state: dict[str, dict[str, Any]], monitor: Monitor, faults: list[dict[str, Any]],
            fault_errors: list[str], r: Any, **times: Any) -> dict[str, Any]:
    """The probe's figures and verdict: each batch is resolved (200), refused (4xx) or unresolved
    (given up), and every part of the accounting above is computed over those three lists."""
    resolved = [b for b in batches if b.final_status == 200]
    unresolved = [b for b in batches if b.final_status is None]
    refused = [b for b in batches if b.final_status is not None and b.final_status != 200]
    by_group, landed, landed_by_node, exact_nodes = _by_group(groups, resolved, applied)
    lost = sum(v["lost"] for v in by_group.values())
    twice = sum(v["applied_twice"] for v in by_group.values())
    dedup = _dedup_check(r, groups, tag, resolved, unresolved)
    node_mismatch = {n: [landed_by_node.get(n, 0), per_node_applied.get(n, 0)]
                     for n in set(landed_by_node) | set(per_node_applied)
                     if landed_by_node.get(n, 0) != per_node_applied.get(n, 0)}
    reset_possible = any(s not in ("healthy", "degraded") for s in monitor.states)
    _fault_windows(faults, stats.failures, times["t0_wall"])
    procs = {name: {"starts": p.starts, "killed_by_probe": p.killed_by_probe,
                    "unexpected_exits": p.unexpected_exits} for name, p in cluster.procs.items()}
    stream_left = {g: {k: v for k, v in s.items() if k != "done"} for g, s in state.items()}
    drained_ok = bool(state) and all(s.get("done") for s in state.values())
    problems = _problems(lost, twice, unresolved, drained_ok, dedup, resolved, refused, fault_errors)
    return {
        "verdict": "FAIL" if problems else "PASS",
        "problems": problems,
        "records_lost": lost,
        "records_applied_twice": twice,
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "keep_logs")},
        "setup_s": round(times["setup_s"], 1),
        "nominal_sending_s": round(times["nominal_s"], 1),
        "generation_s": round(times["generated_s"], 1) if times["generated_s"] else None,
        "sending_s": round(times["sending_s"], 1),
        "drain_s": round(times["drain_s"], 1),
        "records": _records(batches, resolved, refused, unresolved, landed, sum(applied.values()),
                            times["sending_s"]),
        "by_group": by_group,
        "dedup_set_check": dedup,
        "per_node_check": {
            "nodes": len(landed_by_node),
            "mismatching_nodes": len(node_mismatch),
            "examples_landed_vs_applied": dict(sorted(node_mismatch.items())[:5]),
            "exact": exact_nodes and not reset_possible,
            "note": "decode-EMA counts; reset when a node recovers from quarantine",
        },
        "http": _http(stats, batches, resolved, times["t0_wall"]),
        "faults": faults,
        "fault_errors": fault_errors,
        "weights": _weights(monitor, groups, times["t0_wall"]),
        "node_states_seen": dict(monitor.states),
        "streams_at_end": stream_left,
        "processes": procs,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _summary(f: dict[str, Any]) -> str:
    """The figures that matter, in a few lines (after the JSON)."""
    if "records" not in f:
        return f"verdict {f.get('verdict')}: {f.get('error', '')[-500:]}"
    rec, http = f["records"], f["http"]
    lines = [
        f"verdict {f['verdict']} {f['problems'] or ''}",
        f"records: sent {rec['sent']}, http accepted {rec['http_accepted']} + duplicates "
        f"{rec['http_duplicates_after_lost_answers']} = landed {rec['landed']}, applied {rec['applied_by_detectors']}; "
        f"lost {f['records_lost']}, applied twice {f['records_applied_twice']}, unresolved {rec['unresolved_records']}",
        f"http: {http['posts']} POSTs, {http['answers_5xx']} 5xx ({http['answers_503']} 503), "
        f"{http['connection_errors']} connection errors, {http['retries']} retries",
    ]
    for ev in f["faults"]:
        lasted = ev.get("lasted_s", ev.get("paused_s", ev.get("restarted_after_s")))
        extra = ev.get("died_holding_lock_of") or ev.get("tick_locks_held_at_kill") or ""
        lines.append(f"fault {ev['fault']} at {ev.get('at_s')} s, lasted {lasted} s {extra}")
    for g, w in f["weights"].items():
        lines.append(f"weights {g}: longest gap {w['longest_gap_s']} s (stale_after_s {w['stale_after_s']}, "
                     f"under: {w['stayed_under_stale_after_s']})")
    return "\n".join(lines)

