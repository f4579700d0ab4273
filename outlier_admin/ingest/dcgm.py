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
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from outlier_admin.fleet.models import Node
from outlier_admin.fleet.names import validate_scrape_url
from outlier_admin.ingest.models import GpuReading, RejectedInput

log = logging.getLogger(__name__)

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


def parse_metrics(text: str) -> dict[str, dict[str, Any]]:
    """Prometheus text of one exporter -> ``{gpu_key: reading}``; ``gpu_key`` is the UUID (or the
    ``gpu`` index). A reading holds the :data:`FIELDS` it found plus gpu/uuid/model/hostname."""
    gpus: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples "<family>_total"; match on the family name.
            field = FIELDS.get(sample.name) or FIELDS.get(family.name)
            if field is None:
                continue
            labels = sample.labels
            gpu = labels.get("gpu")
            uuid = labels.get("UUID") or labels.get("uuid") or ""
            if gpu is None and not uuid:
                continue  # an aggregate without GPU identity: not attributable
            key = uuid or f"gpu{gpu}"
            reading = gpus.setdefault(key, {
                "gpu": gpu or "", "uuid": uuid, "model_name": labels.get("modelName", ""),
                "hostname": labels.get("Hostname") or labels.get("hostname") or "",
            })
            value = float(sample.value)
            if value != value or is_blank(value):
                reading.setdefault(field, None)
                continue
            reading[field] = int(value) if field in INTEGER_FIELDS else value
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


def record_scrape(node: Node, text: str) -> list[GpuReading]:
    """Store the readings of one scrape, update the node's evidence, propose quarantine on faults."""
    from outlier_admin.control.actions import do_propose_quarantine

    gpus = parse_metrics(text)
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


def scrape_node(node: Node, *, client: httpx.Client | None = None) -> list[GpuReading]:
    """GET the node's ``dcgm_url`` and record it; a failed scrape is kept as rejected input."""
    own = client is None
    client = client or httpx.Client(timeout=settings.DCGM_TIMEOUT_S)
    try:
        # Re-checked at each scrape (a row written before validation existed); never a redirect.
        resp = client.get(validate_scrape_url(node.dcgm_url), follow_redirects=False)
        resp.raise_for_status()
        return record_scrape(node, resp.text)
    except (httpx.HTTPError, ValueError) as exc:
        RejectedInput.objects.create(source=f"dcgm:{node}", reason="scrape_failed", detail=str(exc)[:2000],
                                     raw=node.dcgm_url)
        return []
    finally:
        if own:
            client.close()


def scrape_all() -> int:
    """Scrape every node with a ``dcgm_url``; returns the number of GPU readings stored."""
    n = 0
    with httpx.Client(timeout=settings.DCGM_TIMEOUT_S) as client:
        for node in Node.objects.filter(retired=False).exclude(dcgm_url="").select_related("group"):
            n += len(scrape_node(node, client=client))
    return n
