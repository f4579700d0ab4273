"""Peer-outlier detection for LLM inference node groups: pure Python + numpy, no I/O.

A node that has gone *gray* (PCIe link downgraded, thermally throttled, replaying ECC errors, swapping
its KV cache) still answers its health checks; only its latency gives it away, and only relative to its
peers serving the same model on the same hardware. This package turns per-request samples into
per-node weights for a gateway, with an explanation for every decision.

Import each name from its module (``from detector.group import GroupDetector``): this package exports
nothing of its own.

Modules, one concept each (read in this order):

- :mod:`detector.states` — node states (:mod:`contract.traffic`: the states and the traffic table,
  shared with the gateways), allowed edges, the safeguard cap, transition records
- :mod:`detector.thresholds` — the validated per-group configuration
- :mod:`detector.engine_metrics` — a model server's ``/metrics`` page -> streamed progress rows
- :mod:`detector.samples` — request samples and streamed progress rows, validation (against the
  record contract, :mod:`contract.records`), the signal formulas
- :mod:`detector.costmodel` — the learned per-group cost model used to normalise latency
- :mod:`detector.ewma` — vectorised EW mean/variance per node
- :mod:`detector.signals` — the four signals (two queue-free), their fits, decode at equal batch, and
  each node's EW statistics of them
- :mod:`detector.nodes` — the per-node state of a group as one typed table of columns
- :mod:`detector.window` — per-node sliding windows and percentiles
- :mod:`detector.baseline` — peer baseline and Z-score (seed and robust)
- :mod:`detector.evidence` — per-node CUSUM of excess over the materiality line (gates a weight cut)
- :mod:`detector.detectors` — independent detectors behind one interface (``Detector``: the columns it
  owns, its verdicts): ``zscore`` (and the deciding signal), ``tail``, ``cross_p50``, ``errors``
- :mod:`detector.ejection` — the one ejection layer above them: persistence, cause priority, dry run,
  the safeguard cap, soft degrade with flap damping, restore, probes
- :mod:`detector.moves` — every state edge taken, checked and recorded
- :mod:`detector.evaluation` — the one evaluation sequence, which a tick and the threshold preview
  both run
- :mod:`detector.weights` — from states to weights, and what is published (the shadow policy's too)
- :mod:`detector.explain` — the outcome of a tick and the explanation of every transition
- :mod:`detector.canary` — the canary probe's pass limit (the rule, once)
- :mod:`detector.operator` — canary probes and operator actions on single nodes
- :mod:`detector.snapshot` — the exact snapshot of a group detector
- :mod:`detector.group` — :class:`GroupDetector`, which composes the above
- :mod:`detector.picking` — smooth weighted round-robin and power-of-two-choices
"""
