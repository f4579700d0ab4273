"""The drill's routers (bench/drill/gateways.py) over the harness's fake servers: each starts with its
own defence, answers the drill's request shape through the surface the drill uses, and says what it
ran; the agent's options for it carry the drill's group. Seconds, not a drill."""

from __future__ import annotations

import http.client
import json

import pytest

from bench.drill import gateways
from bench.drill.load import MODEL
from harness.gateways import FakeInferenceServer, make_workdir


@pytest.mark.parametrize("kind", ["envoy", "traefik", "caddy"])
def test_each_router_routes_the_drills_requests_with_its_defence_on(kind):
    reason = gateways.unavailable_reason(kind)
    if reason:
        pytest.skip(reason)
    servers = [FakeInferenceServer(f"f{i}", base_delay_s=0.01) for i in range(2)]
    gw = gateways.start_gateway(kind, make_workdir("oa-drill-gw-"), {s.name: s.address for s in servers}, "drill-test")
    try:
        for _ in range(6):
            conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
            conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2}),
                         headers={"Content-Type": "application/json", **gw.request_headers})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            assert resp.status == 200
            named = gw.served_by(resp.getheader(gateways.SERVED_BY))
            assert named is None or named in {s.address for s in servers}
        assert sum(s.requests for s in servers) == 6
        described = gw.describe()
        assert described["policy"] == gateways.ROUTER_POLICY[kind] and described["defence"] is True
        assert gw.access_log.exists()
    finally:
        gw.stop()
        for s in servers:
            s.stop()


def test_the_llm_routers_get_the_group_on_the_agents_command_line():
    class Fake:
        url, port = "http://127.0.0.1:1", 1

        def agent_args(self):
            return ["--gateway", "smg", "--router-url", self.url]

    gw = gateways.RouterGateway("smg", Fake(), make_workdir("oa-drill-gw-"), "drill-x", policy="power_of_two")
    assert gw.agent_args("drill-x") == ["--gateway", "smg", "--router-url", "http://127.0.0.1:1", "--group", "drill-x"]
    litellm = gateways.RouterGateway("litellm", Fake(), make_workdir("oa-drill-gw-"), "drill-x", policy="latency")
    assert litellm.request_headers["Authorization"].startswith("Bearer ")
    with pytest.raises(NotImplementedError):
        litellm.agent_args("drill-x")  # its callback reads the weights; no agent
