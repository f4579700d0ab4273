"""dcgm-exporter scrapes: Prometheus text -> per-GPU readings -> evidence and hard-fault proposals.

Parsing uses ``prometheus_client.parser`` (not a hand-written parser). Label spellings differ
between exporter versions (``Hostname`` in 3.x, ``hostname`` since d5e5f51; ``UUID``; ``gpu``);
both are accepted. DCGM reports unsupported fields as "blank" sentinels (int64
``9223372036854775792..``, int32 ``2147483632..``, fp64 ``140737488355328``); those read as None.

Hard faults (each raises a quarantine proposal on its own, source ``gpu_fault``):

- ``ecc_dbe``: any double-bit ECC error (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` > 0);
- ``xid_<n>`` for XID 48 (DBE), 63/64 (row remapping), 74 (NVLink), 79 (fell off the bus),
  94/95 (contained/uncontained ECC) in ``DCGM_FI_DEV_XID_ERRORS``;
- ``pcie_link_degraded``: link generation or width below the group's norm
  (``ModelGroup.pcie_link_gen_norm``/``_width_norm``, else the most common value in the group).

dcgm-exporter's default counters leave ECC, PCIe link gen/width and clock-event reasons off:
deploy it with ``outlier_admin/ingest/deploy/dcgm-outlier-counters.csv`` (see README "GPU evidence").

**A scrape is bounded and one node's failure is that node's.** One round (:func:`scrape_all`, the
Celery beat entry every ``DCGM_SCRAPE_INTERVAL_S``) fetches every exporter concurrently (at most
``DCGM_MAX_CONNECTIONS`` at once) with the model-server scraper's own fetch
(:func:`outlier_admin.ingest.scraper.fetch`: no redirect, the body cut at ``DCGM_MAX_BYTES``, one
timeout ``DCGM_TIMEOUT_S`` from the request to the last byte, UTF-8) through
:func:`outlier_admin.fleet.netguard.guarded_connector` (a name that resolves to a forbidden address is
refused when it is resolved). A page is parsed as it arrives (the text is dropped then), every label
and number checked against what the database holds (:data:`LABEL_MAX`, :data:`FIELD_RANGES`,
:data:`MAX_GPUS`) before anything is written, and each node's readings are written in a transaction of
their own. A failure (:data:`KINDS`) is counted in ``outlier_dcgm_scrape_failures_total{group,node,kind}``
and kept as rejected input (``dcgm:<group>/<node>``, reason ``scrape_failed``, at most once per node,
kind and ``REJECT_EVERY_S``, as the model-server scrapes); the other nodes of the round are scraped and
recorded as usual.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import aiohttp
import redis
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from contract import keys
from contract.names import NameError_, validate_scrape_url
from outlier_admin.fleet.models import Node
from outlier_admin.fleet.netguard import forbidden_cause, guarded_connector
from outlier_admin.ingest.models import GpuReading, RejectedInput
from outlier_admin.ingest.scraper import REJECT_EVERY_S, ScrapeError, fetch

log = logging.getLogger(__name__)

#: Failure kinds (the metric's ``kind`` label): those :func:`~outlier_admin.ingest.scraper.fetch` raises
#: (no answer within the timeout, no connection, a status other than 200, a body over the cap, broken
#: HTTP, not UTF-8 as ``parse``), a page the parser refuses or with a label or number out of bounds
#: (``parse``), a stored URL that no longer validates, a host that resolves to a forbidden address, and
#: a row the database refused.
KINDS = ("timeout", "connect", "http_status", "too_large", "protocol", "parse", "bad_url", "forbidden_address",
         "database")
FIELDS = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",  # newer name of the same bitmask
    "DCGM_FI_DEV_PCIE_LINK_GEN": "pcie_link_gen",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "pcie_link_width",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_count",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
}
INTEGER_FIELDS = {"throttle_reasons", "pcie_link_gen", "pcie_link_width", "pcie_replay_count",
                  "ecc_sbe", "ecc_dbe", "xid"}
HARD_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})

_BIGINT_MAX = 2**63 - 1
#: What a reading may hold, per field, checked before the database sees it (a value outside makes the
#: page that node's ``parse`` failure; a "blank" sentinel is None before this check). Ranges are
#: physical bounds with a wide margin, not what a healthy GPU reads, so a real exporter never trips
#: them: a temperature between absolute zero and 1000 °C, an SM clock up to 100 GHz, PCIe generation
#: up to 100 and width up to x256, an XID up to 65,535 (NVIDIA's catalogue ends below 200), a board
#: under 100 kW, a frame buffer under 10^9 MiB; counters and the bitmask are non-negative and fit the
#: BIGINT column. Their upper ends also keep each value inside its column (SMALLINT, INTEGER, BIGINT).
FIELD_RANGES: dict[str, tuple[float, float]] = {
    "temperature_c": (-273.15, 1000.0),
    "sm_clock_mhz": (0.0, 100_000.0),
    "throttle_reasons": (0, _BIGINT_MAX),
    "pcie_link_gen": (0, 100),
    "pcie_link_width": (0, 256),
    "pcie_replay_count": (0, _BIGINT_MAX),
    "ecc_sbe": (0, _BIGINT_MAX),
    "ecc_dbe": (0, _BIGINT_MAX),
    "xid": (0, 65_535),
    "power_w": (0.0, 100_000.0),
    "fb_used_mib": (0.0, 1e9),
}
#: The longest label a reading keeps: the column's own length (one owner, the model); a longer one,
#: or one with a control character (PostgreSQL text holds no NUL), makes the page a ``parse`` failure.
LABEL_MAX = {name: GpuReading._meta.get_field(name).max_length for name in ("gpu", "uuid", "model_name", "hostname")}
#: GPUs one exporter may report: a node is one host (8 GPUs on an HGX board, 16 on the largest); past
#: 64 the page is not one node's and would write that many rows a scrape.
MAX_GPUS = 64

# nvmlClocksThrottleReasons / DCGM clock event reasons bitmask.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def is_blank(value: float) -> bool:
    """DCGM's "no value / not supported" sentinels (int64, int32 and fp64 blanks)."""
    return value >= 9.223372036854775e18 or 2147483632 <= value <= 2147483647 or value >= 140737488355328.0


def decode_throttle(mask: int | None) -> list[str]:
    """Names of the bits set in a clock-throttle-reasons bitmask (unknown bits as ``bit_0x..``)."""
    if not mask:
        return []
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_BITS)
    if unknown:
        names.append(f"bits_{unknown:#x}")
    return names


def _label(labels: dict[str, str], field: str, *names: str) -> str:
    value = next((labels[n] for n in names if labels.get(n)), "")
    if len(value) > LABEL_MAX[field] or not value.isprintable():
        raise ValueError(f"label {names[0]} ({len(value)} characters) is over {LABEL_MAX[field]} characters "
                         "or holds a control character")
    return value


def _bounded(field: str, sample_name: str, value: float) -> int | float:
    lo, hi = FIELD_RANGES[field]
    if not lo <= value <= hi:  # also -inf (+inf is a blank)
        raise ValueError(f"{sample_name} = {value:g} is outside {lo:g}..{hi:g}")
    return int(value) if field in INTEGER_FIELDS else value


def parse_metrics(text: str) -> dict[str, dict[str, Any]]:
    """Prometheus text of one exporter -> ``{gpu_key: reading}``; ``gpu_key`` is the UUID (or the
    ``gpu`` index). A reading holds the :data:`FIELDS` it found plus gpu/uuid/model/hostname, each
    within :data:`FIELD_RANGES` / :data:`LABEL_MAX`; ``ValueError`` for a page that is not an
    exporter's or holds a value out of bounds, or more than :data:`MAX_GPUS` GPUs."""
    gpus: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples "<family>_total"; match on the family name.
            field = FIELDS.get(sample.name) or FIELDS.get(family.name)
            if field is None:
                continue
            labels = sample.labels
            gpu = _label(labels, "gpu", "gpu")
            uuid = _label(labels, "uuid", "UUID", "uuid")
            if not gpu and not uuid:
                continue  # an aggregate without GPU identity: not attributable
            key = uuid or f"gpu{gpu}"
            reading = gpus.get(key)
            if reading is None:
                if len(gpus) >= MAX_GPUS:
                    raise ValueError(f"more than {MAX_GPUS} GPUs on one exporter's page")
                reading = gpus[key] = {
                    "gpu": gpu, "uuid": uuid, "model_name": _label(labels, "model_name", "modelName"),
                    "hostname": _label(labels, "hostname", "Hostname", "hostname"),
                }
            value = float(sample.value)
            if math.isnan(value) or is_blank(value):
                reading.setdefault(field, None)
                continue
            reading[field] = _bounded(field, sample.name, value)
    return gpus


def hard_faults(reading: dict[str, Any], *, gen_norm: int | None, width_norm: int | None) -> list[str]:
    """Hard-fault codes of one reading (see module docstring)."""
    faults = []
    if (reading.get("ecc_dbe") or 0) > 0:
        faults.append("ecc_dbe")
    xid = reading.get("xid")
    if xid in HARD_XIDS:
        faults.append(f"xid_{xid}")
    gen, width = reading.get("pcie_link_gen"), reading.get("pcie_link_width")
    if (gen_norm and gen and gen < gen_norm) or (width_norm and width and width < width_norm):
        faults.append("pcie_link_degraded")
    return faults


def _group_norm(node: Node) -> tuple[int | None, int | None]:
    group = node.group
    if group.pcie_link_gen_norm and group.pcie_link_width_norm:
        return group.pcie_link_gen_norm, group.pcie_link_width_norm
    recent = GpuReading.objects.filter(node__group=group, at__gte=timezone.now() - timedelta(hours=1))
    gens = Counter(v for v in recent.values_list("pcie_link_gen", flat=True) if v)
    widths = Counter(v for v in recent.values_list("pcie_link_width", flat=True) if v)
    gen = group.pcie_link_gen_norm or (gens.most_common(1)[0][0] if gens else None)
    width = group.pcie_link_width_norm or (widths.most_common(1)[0][0] if widths else None)
    return gen, width


def record_readings(node: Node, gpus: dict[str, dict[str, Any]]) -> list[GpuReading]:
    """Store the readings of one scrape (:func:`parse_metrics`), update the node's evidence, propose
    quarantine on hard faults; all in one transaction (a savepoint inside the caller's), so a row the
    database refuses leaves nothing of this node's scrape behind."""
    from outlier_admin.control.actions import do_propose_quarantine

    gen_norm, width_norm = _group_norm(node)
    now = timezone.now()
    rows, evidence, all_faults = [], {}, []
    model_fields = {f.name for f in GpuReading._meta.get_fields()}
    for key, reading in gpus.items():
        faults = hard_faults(reading, gen_norm=gen_norm, width_norm=width_norm)
        all_faults.extend(f"{key}:{f}" for f in faults)
        rows.append(GpuReading(node=node, at=now, faults=faults,
                               **{k: v for k, v in reading.items() if k in model_fields}))
        evidence[key] = {**reading, "throttle": decode_throttle(reading.get("throttle_reasons")), "faults": faults}
    with transaction.atomic():
        GpuReading.objects.bulk_create(rows)
        Node.objects.filter(pk=node.pk).update(gpu_evidence={"at": now.isoformat(), "gpus": evidence})
        if all_faults:
            do_propose_quarantine(
                node, actor="system:dcgm", source="gpu_fault",
                reason="GPU hard fault: " + ", ".join(all_faults), evidence={"gpus": evidence},
            )
    return rows


def record_scrape(node: Node, text: str) -> list[GpuReading]:
    """Parse and store one page of ``node`` (``ValueError`` for a page :func:`parse_metrics` refuses)."""
    return record_readings(node, parse_metrics(text))


@dataclass
class Outcome:
    """One node's part of a round: its readings (parsed, not stored yet) or its failure."""

    node: Node
    gpus: dict[str, dict[str, Any]] | None = None
    error: ScrapeError | None = None


async def _scrape(session: aiohttp.ClientSession, gate: asyncio.Semaphore, node: Node,
                  timeout: aiohttp.ClientTimeout, max_bytes: int) -> Outcome:
    try:
        # Re-checked at each scrape (a row written before validation existed); never a redirect.
        url = validate_scrape_url(node.dcgm_url)
    except NameError_ as exc:
        return Outcome(node, error=ScrapeError("bad_url", exc.detail))
    async with gate:  # the timeout runs from the request on, not while waiting for a place
        try:
            text = await fetch(session, url, timeout=timeout, max_bytes=max_bytes)
        except ScrapeError as exc:
            refused = forbidden_cause(exc)
            return Outcome(node, error=ScrapeError("forbidden_address", refused.detail) if refused else exc)
    try:
        return Outcome(node, gpus=parse_metrics(text))  # parsed now: the page's text is not kept
    except Exception as exc:  # whatever a page does to the parser is that page's failure
        return Outcome(node, error=ScrapeError("parse", f"{type(exc).__name__}: {exc}"[:1000]))


async def fetch_round(nodes: list[Node], *, timeout_s: float | None = None, max_bytes: int | None = None,
                      max_connections: int | None = None) -> list[Outcome]:
    """Fetch and parse every node's page concurrently (see module docstring); no database access."""
    timeout = aiohttp.ClientTimeout(total=timeout_s or settings.DCGM_TIMEOUT_S)  # request -> last byte
    limit = max_connections or settings.DCGM_MAX_CONNECTIONS
    gate = asyncio.Semaphore(limit)
    connector = guarded_connector(limit=limit, limit_per_host=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False, timeout=timeout,
                                     skip_auto_headers=("User-Agent",), raise_for_status=False) as session:
        return list(await asyncio.gather(*(_scrape(session, gate, n, timeout, max_bytes or settings.DCGM_MAX_BYTES)
                                           for n in nodes)))


def _failed(node: Node, exc: ScrapeError, r: redis.Redis | None) -> None:
    """Count a node's failure and keep it as rejected input (once per node, kind and REJECT_EVERY_S)."""
    from outlier_admin.observability.metrics import DCGM_SCRAPE_FAILURES

    group = node.group.name
    DCGM_SCRAPE_FAILURES.labels(group=group, node=node.name, kind=exc.kind).inc()
    log.warning("dcgm scrape of %s/%s failed (%s): %s", group, node.name, exc.kind, exc)
    try:
        keep = r is None or r.set(keys.dcgm_rejected(group, node.name, exc.kind), 1, nx=True,
                                  ex=REJECT_EVERY_S)
    except redis.RedisError:
        keep = True  # Redis away: keep it rather than lose it
    if keep:
        RejectedInput.objects.create(source=f"dcgm:{group}/{node.name}"[:100], reason="scrape_failed",
                                     detail=f"{exc.kind}: {exc}"[:2000], raw=node.dcgm_url)


def _record(outcome: Outcome) -> tuple[list[GpuReading], ScrapeError | None]:
    if outcome.error is not None:
        return [], outcome.error
    try:
        return record_readings(outcome.node, outcome.gpus or {}), None
    except (DataError, IntegrityError) as exc:  # this node's rows; the connection is fine (savepoint)
        return [], ScrapeError("database", f"{type(exc).__name__}: {exc}"[:1000])
    except DatabaseError:
        raise  # the database itself is away: no node can be recorded
    except Exception as exc:
        log.exception("dcgm scrape of %s not recorded", outcome.node)
        return [], ScrapeError("database", f"{type(exc).__name__}: {exc}"[:1000])


def scrape_nodes(nodes: list[Node], **kwargs: Any) -> list[GpuReading]:
    """One round over ``nodes`` (fetched concurrently, then recorded one node at a time); returns the
    GPU readings stored. ``kwargs`` as :func:`fetch_round`."""
    from outlier_admin.control.redis_conn import get_redis

    if not nodes:
        return []
    outcomes = asyncio.run(fetch_round(nodes, **kwargs))
    try:
        r: redis.Redis | None = get_redis()
    except Exception:  # no throttle then; every failure is kept
        r = None
    stored: list[GpuReading] = []
    for outcome in outcomes:
        rows, error = _record(outcome)
        stored.extend(rows)
        if error is not None:
            _failed(outcome.node, error, r)
    return stored


def scrape_node(node: Node, **kwargs: Any) -> list[GpuReading]:
    """Scrape and record one node (a round of one); a failure is counted and kept as rejected input."""
    return scrape_nodes([node], **kwargs)


def scrape_all(**kwargs: Any) -> int:
    """Scrape every live node with a ``dcgm_url``; returns the number of GPU readings stored."""
    nodes = list(Node.objects.filter(retired=False, group__retired=False).exclude(dcgm_url="").select_related("group"))
    return len(scrape_nodes(nodes, **kwargs))
