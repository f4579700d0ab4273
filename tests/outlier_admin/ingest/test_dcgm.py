"""DCGM parsing on the real exporter capture, sentinels, bitmask, hard-fault proposals."""

from __future__ import annotations

import pytest

from outlier_admin.control.models import QuarantineProposal
from outlier_admin.ingest.dcgm import decode_throttle, hard_faults, parse_metrics, record_scrape
from tests.conftest import FIXTURES

TEXT = (FIXTURES / "dcgm" / "datadog-dcgm-metrics.txt").read_text()


def test_old_exporter_capture_per_gpu():
    gpus = parse_metrics(TEXT)
    a = gpus["GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    assert (a["hostname"], a["model_name"], a["temperature_c"], a["sm_clock_mhz"]) == ("424773df46e0", "Tesla T4", 25.0, 300.0)
    assert a["pcie_replay_count"] == 0 and a["xid"] == 0
    b = gpus["GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"]
    assert b["throttle_reasons"] == 1 and decode_throttle(b["throttle_reasons"]) == ["gpu_idle"]


def test_new_label_spelling_and_sentinel():
    text = (
        '# TYPE DCGM_FI_DEV_PCIE_LINK_GEN gauge\n'
        'DCGM_FI_DEV_PCIE_LINK_GEN{gpu="1",UUID="GPU-x",hostname="h1",pci_bus_id="0000:3b:00.0"} 1\n'
        '# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n'
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",UUID="GPU-x",hostname="h1"} 9223372036854775794\n'
    )
    gpu = parse_metrics(text)["GPU-x"]
    assert gpu["hostname"] == "h1" and gpu["pcie_link_gen"] == 1 and gpu["ecc_dbe"] is None
    assert hard_faults(gpu, gen_norm=5, width_norm=16) == ["pcie_link_degraded"]


def test_hard_faults():
    assert hard_faults({"ecc_dbe": 2, "xid": 79}, gen_norm=None, width_norm=None) == ["ecc_dbe", "xid_79"]
    assert hard_faults({"xid": 13, "pcie_link_gen": 5, "pcie_link_width": 16}, gen_norm=5, width_norm=16) == []
    assert decode_throttle(0x48) == ["hw_slowdown", "hw_thermal_slowdown"]


@pytest.mark.django_db
def test_fault_opens_one_gpu_proposal_and_keeps_evidence():
    from outlier_admin.control.actions import do_create_group, do_register_node

    node = do_register_node(do_create_group("g", actor="t"), "127.0.0.1:8000", actor="t")
    text = '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-y"} 79\n'
    record_scrape(node, text)
    record_scrape(node, text)
    p = QuarantineProposal.objects.get(node=node)
    assert p.source == "gpu_fault" and "xid_79" in p.reason
    node.refresh_from_db()
    assert node.gpu_evidence["gpus"]["GPU-y"]["faults"] == ["xid_79"]
    assert node.gpu_readings.count() == 2
