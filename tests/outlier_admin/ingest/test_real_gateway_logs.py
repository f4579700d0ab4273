"""A real nginx and a real HAProxy write their default access logs; ``tail_logs --format auto`` takes
them into the pipeline with no custom configuration: latency-only records in the stream, nodes keyed
by address, and every refused line counted by a reason that names its format."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from django.core.management import call_command

from agent.haproxy import RuntimeAPI
from agent.shipper import node_map_from_haproxy
from contract import keys
from contract.stream import decode_requests
from harness.gateways import FakeInferenceServer, SyslogCollector, send_traffic
from outlier_admin.control.tick import _batch
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.models import RejectedInput
from tests.outlier_admin.ingest.real_gateways import DefaultHAProxy, DefaultNginx, wait_lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.timeout(60)]
N = 8


@pytest.fixture
def servers():
    """Two fake inference servers; s1 four times as slow (twice was within the noise of a loaded host:
    43 ms against 30 ms, where the test reads "1.5x slower")."""
    fleet = {f"s{i}": FakeInferenceServer(f"s{i}", base_delay_s=0.02 * (1 + 3 * i)) for i in range(2)}
    yield {name: srv.address for name, srv in fleet.items()}
    for srv in fleet.values():
        srv.stop()


def tail(name: str, path, *extra: str) -> str:
    out = io.StringIO()
    call_command("tail_logs", "--add", name, "--path", str(path), "--group", "llm", *extra, "--once", stdout=out)
    return out.getvalue()


def stream_rows(redis_client, group: str = "llm") -> list[list]:
    return [row for _, fields in redis_client.xrange(keys.stream(group)) for row in decode_requests(fields)]


def test_nginx_default_logs(tmp_path, servers, redis_client, make_group):
    make_group("llm")
    with DefaultNginx(tmp_path, servers) as nginx:
        assert send_traffic(nginx.url, N).total == N
        for path in nginx.logs.values():
            assert len(wait_lines(lambda p=path: p.read_text().splitlines(), N)) == N

        # combined + $request_time $upstream_addr $upstream_response_time: as it is.
        printed = tail("upstream", nginx.logs["upstream"])
        assert printed.splitlines() == [f"upstream: accepted {N} ({N} latency-only) rejected 0"]
        rows = stream_rows(redis_client)
        assert len(rows) == N and {r[0] for r in rows} == set(servers.values())  # keyed by address
        assert all(r[2] is None and r[3] is None and r[5] > 0 for r in rows)  # null tokens in the stream
        by_node = {addr: np.median([r[5] for r in rows if r[0] == addr]) for addr in servers.values()}
        assert by_node[servers["s1"]] > 1.5 * by_node[servers["s0"]]  # the slower server is seen slower
        # The tick reads null token counts as NaN (latency-only) and the latencies as they are.
        batch = _batch(rows)
        assert np.isnan(batch.prompt_tokens).all() and np.isnan(batch.completion_tokens).all()
        assert batch.total_ms.tolist() == [r[5] for r in rows]
        assert set(Node.objects.values_list("address", flat=True)) == set(servers.values())

        # Plain combined: no node, no time. Refused, and tail_logs says why and in which format.
        printed = tail("combined", nginx.logs["combined"])
        assert printed.splitlines() == [
            f"combined: accepted 0 (0 latency-only) rejected {N}",
            f"  rejected {N} no_upstream (looks like nginx (combined / ingress-nginx))",
        ]
        rejected = RejectedInput.objects.filter(source="log:combined")
        assert sum(r.count for r in rejected) == N and {r.looks_like for r in rejected} == {"nginx"}
        assert all(r.raw.startswith("127.0.0.1 - - [") for r in rejected)

        # combined + $request_time $upstream_response_time behind a one-node nginx: its node is given.
        target = servers["s0"]
        printed = tail("timed", nginx.logs["timed"], "--node-map", f"*={target}")
        assert printed.splitlines() == [f"timed: accepted {N} ({N} latency-only) rejected 0"]
        assert sum(1 for r in stream_rows(redis_client) if r[0] == target) == N + N // 2


def test_haproxy_default_httplog(tmp_path, servers, redis_client, make_group):
    make_group("llm")
    logs = SyslogCollector()
    try:
        with DefaultHAProxy(tmp_path, servers, log_port=logs.port) as haproxy:
            assert send_traffic(haproxy.url, N).total == N
            lines = wait_lines(lambda: [x for x in logs.lines if " llm_in " in x], N)
            node_map = node_map_from_haproxy(RuntimeAPI(haproxy.socket_path), "llm")
    finally:
        logs.stop()
    path = tmp_path / "haproxy.log"
    path.write_text("\n".join(lines) + "\n")

    # Without a map HAProxy names servers, not addresses: refused with a reason saying how to map.
    printed = tail("by-name", path)
    assert printed.splitlines()[1] == f"  rejected {N} bad_address (looks like HAProxy httplog)"
    detail = RejectedInput.objects.filter(source="log:by-name").first().detail
    assert "--node-map" in detail and "is not an address" in detail
    assert not Node.objects.exists()  # a server name is never registered as a node

    # With the runtime API's map (what the shipper reads), as an explicit --node-map: keyed by address.
    assert node_map == {f"llm/{name}": addr for name, addr in servers.items()}
    printed = tail("by-address", path, "--node-map", json.dumps(node_map))
    assert printed.splitlines() == [f"by-address: accepted {N} ({N} latency-only) rejected 0"]
    rows = stream_rows(redis_client)
    assert sorted(r[0] for r in rows) == sorted(list(servers.values()) * (N // 2))
    assert set(Node.objects.values_list("name", flat=True)) == set(servers.values())
