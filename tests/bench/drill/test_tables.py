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
