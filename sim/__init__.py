"""Cluster simulator and detection benchmark (pure Python + numpy; matplotlib only for plots).

- :mod:`sim.scenario` — scenario files (``scenarios/SCHEMA.md``), validation with field names
- :mod:`sim.traces` — the measured data in ``data/traces`` (arrivals, tokens, cost curve, VM noise)
- :mod:`sim.workload` — all requests of a scenario, built once, shared by every policy
- :mod:`sim.engine` — the discrete-event simulation (nodes, queues, faults, client, gateway)
- :mod:`sim.policies` / :mod:`sim.default_policy` — the gateway policies compared
- :mod:`sim.report` / :mod:`sim.evidence` — report figures and where each detection's delay went
- :mod:`sim.fastmode` — false-alarm rates on many healthy node-hours
- :mod:`sim.plot`, :mod:`sim.__main__` — PNG and CLI
"""
