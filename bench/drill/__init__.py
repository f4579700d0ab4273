"""The real-engine drill: real llama.cpp servers, a real gateway, the real control plane, a real fault.

Why it exists (issue 24): the simulator's step engines agreed with the detector, and the first user
who tried the product on real parts (five llama.cpp servers behind nginx, one of them put at 20 % of
a core) saw the first weight cut 105 s after the onset, no quarantine, and no better P99 with the
weights than without. This package reproduces that setup on loopback so a fix can be judged by the
same figures the user saw, not by the simulator's.

One concept per module:

- :mod:`.faults`: what goes wrong with a node (a CPU quota, SIGSTOP bursts, a tightening quota);
- :mod:`.engines`: llama.cpp servers (``xllamacpp``) in their own processes;
- :mod:`.gateways`: a real nginx (round robin, ``least_conn``) or HAProxy (``leastconn``) in front;
- :mod:`.load`: an open-loop Poisson load generator that records every request;
- :mod:`.control_plane`: the control plane as a user runs it (Celery worker+beat, ``scrape_metrics``,
  ``tail_logs``, the agent), on the PostgreSQL and Redis it is given;
- :mod:`.report`: the figures (onset -> cut / quarantine, false cuts, latency, shares);
- :mod:`.run` and ``python -m bench.drill``: one drill or the whole matrix.
"""
