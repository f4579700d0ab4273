"""Cluster simulator and detection benchmark (pure Python + numpy; matplotlib only for plots).

- :mod:`detector.sim.scenario` — scenario files (``scenarios/SCHEMA.md``), validation with field names
- :mod:`detector.sim.traces` — the measured data in ``data/traces`` (arrivals, tokens, cost curve, VM noise)
- :mod:`detector.sim.workload` — all requests of a scenario, built once, shared by every policy
- :mod:`detector.sim.engine` — the discrete-event simulation (nodes, queues, faults, client, gateway)
- :mod:`detector.sim.policies` / :mod:`detector.sim.default_policy` — the gateway policies compared
- :mod:`detector.sim.report` / :mod:`detector.sim.cusum` — report figures and the CUSUM floor
- :mod:`detector.sim.fastmode` — false-alarm rates on many healthy node-hours
- :mod:`detector.sim.plot`, :mod:`detector.sim.__main__` — PNG and CLI
"""
