"""Independent detectors behind one interface, with one ejection layer above them (Envoy's outlier
detection: several detection types share one ejection algorithm).

Each detector keeps its own per-node state (the columns it declares, ``Detector.columns``), learns
from samples and says, at every evaluation, which nodes it would take out of service (a
:class:`~detector.detectors.verdict.Verdict` carrying its reason code; the interface is
:class:`~detector.detectors.verdict.Detector`). None of them moves a node: :mod:`detector.ejection` ranks their causes,
asks for persistence, enforces the safeguard cap and each detector's ``enforcing`` switch (a detector
in dry run has its verdicts recorded, not acted on), and takes the state edges.

- :mod:`~detector.detectors.zscore`: the peer baseline and robust Z of every signal, the deciding
  (queue-free) signal, and the per-node evidence that gates a weight cut;
- :mod:`~detector.detectors.tail`: seed 001's P99/P50 ratio over windows;
- :mod:`~detector.detectors.cross_p50`: a P50 over ``cross_p50_ratio`` times the peers';
- :mod:`~detector.detectors.errors`: consecutive errors and success rate (Envoy's).
"""

from detector.detectors.verdict import Detector, Judging, Verdict

__all__ = ["Detector", "Judging", "Verdict"]
