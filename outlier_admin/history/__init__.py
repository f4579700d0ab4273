"""The read model: what the API, the dashboard and the alerts show, read from the rows the tick stored.

One owner per reading, imported by ``api`` and ``dashboard`` (neither owns a read model; this package
imports neither of them, nor does ``control`` import it):

- :mod:`~outlier_admin.history.replay`: stored history rows laid out as the detector's peer views
  (the Z, EMA and baseline of every signal per node and history write, the baseline's fallback,
  the deciding signal picked by :func:`detector.detectors.zscore.decide`): read once, used by the
  threshold preview and the heatmap;
- :mod:`~outlier_admin.history.queries`: a node's latest figures on its deciding signal (the nodes
  table, the API's node views), state orders, the group's stored baseline and safeguard;
- :mod:`~outlier_admin.history.timeline`: a node's timeline and the group's baseline, downsampled;
- :mod:`~outlier_admin.history.preview`: the threshold preview (the replay through
  :func:`detector.evaluation.evaluate`) and its bounds and rate limit.
"""
