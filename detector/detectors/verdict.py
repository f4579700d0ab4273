"""What a detector says of every node at one evaluation: the interface between detectors and the
ejection layer (:mod:`detector.ejection`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detector.states import Reason


@dataclass(frozen=True)
class Verdict:
    """``eject[i]``: the detector wants node ``i`` out of service, for ``reason``. Whether it goes is
    the ejection layer's call (cause priority, persistence, the safeguard cap, the detector's
    ``enforcing`` switch)."""

    reason: Reason
    eject: np.ndarray
