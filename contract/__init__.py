"""The gateway contract: what the control plane and every gateway integration share, in one place.

Plain Python (the standard library, redis-py for :mod:`contract.topology`; orjson where installed):
no Django, no numpy, nothing else of this repository. The agent's distribution (``deploy/agent``)
ships this package with :mod:`agent`; the control plane, the detector, the simulator, the harness
and the benchmarks import it. Each rule has its one owner here:

- :mod:`contract.keys` — every Redis key and channel name
- :mod:`contract.traffic` — the node states and what each means for a gateway's traffic
- :mod:`contract.weights_document` — the weights document: one parse, one build, one check
- :mod:`contract.names` — group names, node ids, addresses
- :mod:`contract.records` — the request record's fields and bounds (the records contract)
- :mod:`contract.normalize` — one record from a gateway's log or a push, checked against it
- :mod:`contract.logformats` — the gateways' access-log formats -> records
- :mod:`contract.stream` — a group's Redis Stream entry: one encoder, one decoder
- :mod:`contract.topology` — one Redis, Sentinel or Cluster: connection, ``is_cluster``, the
  weights' (sharded) publish
"""
