"""No function over 80 lines outside the tests (issue 37): a long function is one that decides several
things without naming them. ``scripts/long_functions.py`` lists them; this keeps the list empty."""

from __future__ import annotations

import importlib.util

from tests.test_compose import ROOT

_spec = importlib.util.spec_from_file_location("long_functions", ROOT / "scripts" / "long_functions.py")
long_functions_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(long_functions_script)


def test_no_function_over_80_lines_outside_the_tests(capsys):
    assert long_functions_script.main([]) == 0, capsys.readouterr().out


def test_a_function_of_81_lines_is_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    path = tmp_path / "long.py"
    path.write_text("def long():\n" + body + "\n")
    found = long_functions_script.long_functions([path], 80)
    assert [n for n, _ in found] == [81] and "long" in found[0][1]
