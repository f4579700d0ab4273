"""HAProxy applier: pure planning, and a real HAProxy driven through its runtime API."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.client import effective_weights
from agent.haproxy import (
    ADMF_FDRAIN,
    ADMF_FMAINT,
    HAProxyApplier,
    RuntimeAPI,
    ServerState,
    haproxy_weight,
    parse_servers_state,
    plan_changes,
)
from contract.weights_document import parse_document
from harness.gateways import HAProxyProcess, weights_document

# Verbatim `show servers state be` output of HAProxy 2.6.12 (Debian 12), s1 drained, s2 in maint.
SHOW_SERVERS_STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 be 1 s1 127.0.0.1 2 8 0 100 0 1 0 2 0 0 0 0 - 18001 - 0 0 - - 0
3 be 2 s2 127.0.0.1 0 1 100 100 0 1 0 0 0 0 0 0 - 18002 - 0 0 - - 0
"""


def eff(servers, **kw):
    import json

    return effective_weights(parse_document(json.dumps(weights_document("g", 1, servers, **kw))), now=0.0)


def test_parse_servers_state():
    s1, s2 = parse_servers_state(SHOW_SERVERS_STATE)
    assert (s1.name, s1.addr, s1.port, s1.uweight, s1.drained, s1.in_maintenance) == (
        "s1", "127.0.0.1", 18001, 0, True, False)
    assert (s2.uweight, s2.drained, s2.in_maintenance) == (100, False, True)


@given(st.integers(1, 1000), st.data())
def test_haproxy_weight_bounds_and_monotonic(base, data):
    w1 = data.draw(st.integers(0, base))
    w2 = data.draw(st.integers(w1, base))
    h1, h2 = haproxy_weight(w1, base), haproxy_weight(w2, base)
    assert 0 <= h1 <= h2 <= 256
    assert (h1 == 0) == (w1 == 0)  # only a real 0 drains; soft-degraded nodes keep a trickle
    assert haproxy_weight(base, base) == 256


def test_plan_only_differences_unknown_and_missing():
    servers = [
        ServerState("be", "a", "127.0.0.1", 80, 256, 0),
        ServerState("be", "b", "127.0.0.2", 80, 256, 0),
        ServerState("be", "c", "127.0.0.3", 80, 0, ADMF_FDRAIN),
        ServerState("be", "maint", "127.0.0.4", 80, 0, ADMF_FDRAIN | ADMF_FMAINT),
        ServerState("be", "stranger", "127.9.9.9", 80, 256, 0),
    ]
    w = eff({"a": "127.0.0.1:80", "b": "127.0.0.2:80", "c": "127.0.0.3:80", "maint": "127.0.0.4:80",
             "ghost": "127.0.0.5:80"}, quarantined=("b",), weights={"c": 50})
    cmds, result = plan_changes(servers, w)
    assert cmds == [
        "set server be/b state drain", "set server be/b weight 0",   # quarantine
        "set server be/c state ready", "set server be/c weight 128",  # restore at half weight
        "set server be/maint weight 256",                            # weight yes, never 'ready' over maint
    ]
    assert result.unknown == ["be/stranger (127.9.9.9:80)"]
    assert result.missing == ["ghost (127.0.0.5:80)"]


@pytest.fixture
def haproxy(tmp_path, addresses):
    with HAProxyProcess(tmp_path, addresses, backend="llm") as proc:
        yield proc


def test_real_haproxy_quarantine_restore_and_idempotence(haproxy, addresses):
    applier = HAProxyApplier(haproxy.socket_path, "llm")
    api = RuntimeAPI(haproxy.socket_path)

    first = applier.apply(eff(addresses))
    assert first.changes == [] and first.unknown == [] and first.missing == []  # config already matches

    result = applier.apply(eff(addresses, quarantined=("s3",), weights={"s1": 25}))
    assert result.changes == ["set server llm/s1 weight 64", "set server llm/s3 state drain",
                              "set server llm/s3 weight 0"]
    state = {s.name: s for s in api.show_servers_state("llm")}
    assert state["s3"].drained and state["s3"].uweight == 0
    assert state["s1"].uweight == 64 and state["s0"].uweight == 256 and not state["s0"].drained

    assert applier.apply(eff(addresses, quarantined=("s3",), weights={"s1": 25})).changes == []  # only changes

    restored = applier.apply(eff(addresses))
    assert restored.changes == ["set server llm/s1 weight 256", "set server llm/s3 state ready",
                                "set server llm/s3 weight 256"]
    state = {s.name: s for s in api.show_servers_state("llm")}
    assert not state["s3"].drained and state["s3"].uweight == 256


def test_real_haproxy_unknown_servers_are_left_alone(haproxy, addresses):
    only_two = {k: addresses[k] for k in ("s0", "s1")}
    result = HAProxyApplier(haproxy.socket_path, "llm").apply(eff(only_two, quarantined=("s1",)))
    assert sorted(u.split(" ")[0] for u in result.unknown) == ["llm/s2", "llm/s3"]
    state = {s.name: s for s in RuntimeAPI(haproxy.socket_path).show_servers_state("llm")}
    assert state["s2"].uweight == 256 and not state["s2"].drained and state["s1"].drained


def test_real_haproxy_safeguard_variable(haproxy):
    applier = HAProxyApplier(haproxy.socket_path, "llm")
    applier.set_safeguard(True)
    assert "value=<1>" in applier.api.command("get var proc.outlier_safeguard")
    applier.set_safeguard(False)
    assert "value=<0>" in applier.api.command("get var proc.outlier_safeguard")


def test_unreachable_socket_and_unknown_backend_raise(tmp_path, haproxy, addresses):
    from agent.base import ApplyError

    with pytest.raises(ApplyError, match="unreachable"):
        HAProxyApplier(str(tmp_path / "nope.sock"), "llm").apply(eff(addresses))
    with pytest.raises(ApplyError):
        HAProxyApplier(haproxy.socket_path, "no_such_backend").apply(eff(addresses))
