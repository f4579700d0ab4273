"""What the control plane announces, for the apps above it to observe without being imported here.

:data:`tick_done` is sent after every tick a worker ran, with ``result`` (the
:class:`outlier_admin.control.tick.TickResult`); :mod:`outlier_admin.observability` records it.
"""

from __future__ import annotations

from django.dispatch import Signal

tick_done = Signal()
