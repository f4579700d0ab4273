"""The drill's tables (docs/peers.md, docs/drill-table.md) are generated from docs/drill-matrix.json and
in sync with it; two cells whose ranges overlap are "no difference", never a ratio."""

from __future__ import annotations

from bench.drill.tables import DRILL_TABLE, MATRIX, PEERS, compare, fmt, main, render_between, stats


def test_the_committed_tables_are_what_the_committed_json_gives():
    assert MATRIX.exists() and PEERS.exists() and DRILL_TABLE.exists()
    assert main(["--check"]) == 0, "run python -m bench.drill.tables and commit docs/peers.md, docs/drill-table.md"


def test_overlapping_ranges_are_no_difference_and_separate_ones_a_ratio():
    a, b = stats([1.0, 1.2, 1.5]), stats([1.4, 3.0, 4.0])
    assert compare(a, b) == "no difference"  # 1.5 >= 1.4: the ranges touch
    c = stats([4.0, 5.0, 6.0])
    assert compare(a, c) == "0.24x"  # 1.2 / 5.0
    assert compare(None, c) == "-"


def test_a_figure_is_its_median_with_its_range_and_how_many_runs_had_it():
    assert fmt(stats([2.0, 1.0, 3.0])) == "2.00 (1.00-3.00)"
    assert fmt(stats([0.5])) == "0.50"
    assert fmt(stats([0.01, 0.03, None]), pct=True) == "2.0 % (1.0 %-3.0 %) [2/3 runs]"
    assert fmt(stats([None, None])) == "-"


def test_only_the_text_between_the_markers_is_replaced():
    from bench.drill.tables import BEGIN, END

    page = f"# Peers\nprose\n{BEGIN}\nold table\n{END}\nmore prose\n"
    out = render_between(page, "new table\n")
    assert out == f"# Peers\nprose\n{BEGIN}\nnew table\n{END}\nmore prose\n"
    assert render_between("# Peers\n", "t\n").endswith(f"{BEGIN}\nt\n{END}\n")


def _run(weights: bool, *, harmed: float, quarantine: float | None, weight: float | None, healthy_cut: int) -> dict:
    after = {"n": 150, "p50_s": 1.0, "p90_s": 3.0, "p95_s": 4.0, "p99_s": 6.0, "timeouts": 0, "errors": 0}
    return {"config": {"gateway": "nginx-rr", "weights": weights, "fault": "quota:0.5", "seed": 1, "canaries": weights},
            "host": {"boot": "b"},
            "figures": {"latency_after_onset": after, "latency_before_onset": after, "harmed_fraction": harmed, "faulty_client_token_share_after": 0.015,
                        "onset_to_first_cut_s": 10.0, "onset_to_quarantine_s": quarantine, "healthy_cut_nodes": healthy_cut,
                        "healthy_quarantined_nodes": 0, "faulty_max_weight_after_cut": weight}}


def test_the_2x_faults_targets_are_judged_quarantine_in_every_run_and_no_flap_over_half_weight():
    """Issue 33's ``quota:0.5`` targets beside the share and harm: quarantined within 30 s in every run
    (a run never quarantined misses it), never over half weight between cut and quarantine, at most one
    healthy server cut."""
    from bench.drill.tables import cell_stats, cells, targets_table

    off = _run(False, harmed=0.10, quarantine=None, weight=None, healthy_cut=0)
    good = _run(True, harmed=0.05, quarantine=22.0, weight=0.05, healthy_cut=1)
    found = cells({"runs": [off, good]})
    row = next(line for line in targets_table({k: cell_stats(v) for k, v in found.items()}, found) if "`quota:0.5`" in line)
    assert "1.5 % (<= 2 %) met" in row and "0.50x (<= 0.7x) met" in row
    assert "1 (<= 1) met" in row and "22.0 (<= 30) met" in row and "5.0 % (<= 50 %) met" in row
    flapped = _run(True, harmed=0.05, quarantine=67.4, weight=0.87, healthy_cut=2)
    unquarantined = _run(True, harmed=0.05, quarantine=None, weight=0.05, healthy_cut=0)
    found = cells({"runs": [off, flapped, unquarantined]})
    row = next(line for line in targets_table({k: cell_stats(v) for k, v in found.items()}, found) if "`quota:0.5`" in line)
    assert "1 (0-2) (<= 1) **missed**" in row and "46.0 % (5.0 %-87.0 %) (<= 50 %) **missed**" in row
    assert "67.4 [1/2 runs] (<= 30) **missed**" in row


def test_the_readme_says_on_which_boot_of_the_host_each_cells_runs_were_made():
    """A restart can bring another machine: the summary letters the boots in the order of their first
    run and counts each cell's runs per boot, at the commits they ran at, with the legend beneath."""
    from bench.drill.tables import readme_summary

    def run(weights: bool, boot: str, at: float) -> dict:
        r = _run(weights, harmed=0.1, quarantine=8.0, weight=0.05, healthy_cut=0)
        r["config"]["fault"] = "quota:0.2"
        r["host"] = {"boot": boot}
        r["started_at"], r["source"] = at, {"commit": "abcdef0123"}
        r["figures"]["fleet_busy_before"] = 0.4 if boot == earlier else 0.7
        return r

    later, earlier = "c63d722e-3c93-441d-a5d9-4c6ff65ac6de", "before-2026-12-06T16:30Z"
    text = readme_summary({"runs": [run(False, later, 2e9), run(True, later, 2e9 + 200),
                                    run(False, earlier, 1.7e9), run(True, later, 2e9 + 400)]})
    row = next(line for line in text.splitlines() if line.startswith("| nginx round robin"))
    assert "| A 1 at abcdef0, B 1 at abcdef0 / B 2 at abcdef0 |" in row
    # With how busy the same fleet and rate kept each machine before the onset: its headroom.
    assert ("Boots of the host: A = `before-2026-12-06T16:30Z` (first run 2023-11-14 22:13 UTC, at abcdef0, fleet "
            "busy before the onset 40.0 %); B = `c63d722e` (first run 2033-05-18 03:33 UTC, at abcdef0, fleet busy "
            "before the onset 70.0 %).") in text
