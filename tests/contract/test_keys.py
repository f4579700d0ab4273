"""The Redis key layout has one owner (:mod:`contract.keys`): no other source spells an ``outlier:``
string, every per-group key sits in the group's cluster hash slot, and the gateway contract's names
(legacy and versioned) are what the agent README says."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from contract import keys
from harness.redis_cluster import slot_of

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "node_modules", "build", "dist", "__pycache__", "staticfiles"}
#: Sources allowed to spell ``outlier:``: the owner, and tests that check raw names on purpose (this
#: one: the contract's names as the agents read them; the deploy rules test: Prometheus recording-rule
#: names, ``outlier:<metric>``, not Redis keys).
ALLOWED = {
    "contract/keys.py",
    "tests/contract/test_keys.py",
    "tests/outlier_admin/observability/test_deploy_rules.py",
}


def _docstring_starts(source: str) -> set[tuple[int, int]]:
    """(line, column) of every docstring: documentation may name a key, code may not."""
    starts = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                starts.add((first.value.lineno, first.value.col_offset))
    return starts


def key_literals(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string literal (f-string parts included) of ``source`` that spells
    ``outlier:``, docstrings and comments excepted (tokenized, not grepped)."""
    docstrings = _docstring_starts(source)
    found = []
    fstring_middle = getattr(tokenize, "FSTRING_MIDDLE", None)  # Python 3.12+ splits f-strings
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        is_string = tok.type == tokenize.STRING or (fstring_middle is not None and tok.type == fstring_middle)
        if is_string and "outlier:" in tok.string and tok.start not in docstrings:
            found.append((tok.start[0], tok.string))
    return found


#: Where the repository's Python lives (data, reports and the venv are not walked).
SOURCE_DIRS = ("contract", "agent", "outlier_admin", "detector", "sim", "bench", "harness", "scripts", "tests", "deploy")


def python_sources() -> list[Path]:
    found = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    return sorted(p for p in found if not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def test_the_literal_finder_sees_code_strings_and_f_strings_but_not_docstrings_or_comments():
    source = (
        '"""Module doc: outlier:weights:<group>."""\n'
        "# outlier:comment\n"
        "def f(g):\n"
        '    """outlier:doc"""\n'
        '    a = "outlier:plain"\n'
        '    return f"outlier:{g}:stream", a\n'
    )
    assert [line for line, _ in key_literals(source)] == [5, 6]


def test_no_source_but_keys_py_spells_an_outlier_key():
    offenders = []
    for path in python_sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        offenders += [f"{rel}:{line}: {text[:80]}" for line, text in key_literals(path.read_text())]
    assert offenders == [], "name Redis keys in contract/keys.py and import them:\n" + "\n".join(offenders)


def test_slot_function_matches_redis_reference_values():
    # From the Redis Cluster specification: CRC16("123456789") = 0x31C3; 0x31C3 % 16384 = 12739.
    assert slot_of("123456789") == 12739
    assert slot_of("{user1000}.following") == slot_of("{user1000}.followers") == slot_of("user1000")


@pytest.mark.parametrize("group", ["llama-70b", "a100.pool@eu/1", "g"])
def test_everything_a_tick_or_an_ingest_touches_for_a_group_shares_itsslot_of(group):
    per_group = [keys.stream(group), keys.state(group), keys.inputs(group), keys.tick_lock(group),
                 keys.tick_queued(group), keys.dedup(group, 7), keys.dedup(group, 6), keys.probes(group),
                 keys.probe_inflight(group, "127.0.0.1:8000"), keys.config_snapshot(group), keys.outbox(group),
                 keys.outage_version(group), keys.itl(group), keys.weights(group),
                 keys.weights_channel(group)]
    assert {slot_of(k) for k in per_group} == {slot_of(group)}
    assert all(keys.group_of(k) == group for k in per_group)
    assert len(set(per_group)) == len(per_group)


def test_two_groups_are_two_slots_and_fleet_wide_keys_belong_to_no_group():
    assert slot_of(keys.stream("g1")) != slot_of(keys.stream("g2"))
    for key in (keys.TICK_LAST, keys.TICKERS, keys.TICKER_GROUPS, keys.GROUPS, keys.ALERTS_ACTIVE, keys.obs("lock"),
                keys.SCRAPER_ALIVE, keys.DEMO_LEASE, keys.LEGACY_WEIGHTS_CHANNEL):
        assert keys.group_of(key) is None, key


def test_the_gateway_contract_names_as_the_agents_read_them():
    assert keys.weights("llama-70b") == "outlier:{llama-70b}:weights:v2"
    assert keys.weights_channel("llama-70b") == "outlier:{llama-70b}:weights"
    assert keys.legacy_weights("llama-70b") == "outlier:weights:llama-70b"
    assert keys.LEGACY_WEIGHTS_CHANNEL == "outlier:weights"
    assert keys.applied("llama-70b") == "outlier:applied:llama-70b"
    assert keys.group_of(b"outlier:weights:llama-70b") == "llama-70b"
    readme = (ROOT / "agent/README.md").read_text()
    for name in ("outlier:{<group>}:weights:v2", "outlier:weights:<group>", "outlier:{<group>}:weights"):
        assert name in readme, name


def test_group_pattern_matches_only_that_groups_keys(redis_client):
    for g in ("demo-x", "demo-x-2", "demo*"):
        redis_client.set(keys.stream(g), b"1")
        redis_client.set(keys.state(g), b"1")
    found = {k.decode() for k in redis_client.scan_iter(match=keys.group_pattern("demo-x"), count=1000)}
    assert found == {keys.stream("demo-x"), keys.state("demo-x")}
    found = {k.decode() for k in redis_client.scan_iter(match=keys.group_pattern("demo*"), count=1000)}
    assert found == {keys.stream("demo*"), keys.state("demo*")}
