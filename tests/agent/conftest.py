"""Fixtures for the gateway agent tests: a unique group, four fake inference servers (one 3x slower)."""

from __future__ import annotations

import uuid

import pytest

from harness.gateways import FakeInferenceServer


@pytest.fixture
def group() -> str:
    # Pub/sub channels are shared by every Redis database number: a unique group keeps other
    # engineers' notifications on "outlier:weights" from being taken for ours.
    return f"agent-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fake_servers():
    """s0..s2 healthy (5 ms), s3 three times slower (15 ms)."""
    servers = {f"s{i}": FakeInferenceServer(f"s{i}", base_delay_s=0.005, slowdown=3.0 if i == 3 else 1.0)
               for i in range(4)}
    yield servers
    for srv in servers.values():
        srv.stop()


@pytest.fixture
def addresses(fake_servers) -> dict[str, str]:
    return {name: srv.address for name, srv in fake_servers.items()}
