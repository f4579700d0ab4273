"""``make demo`` / ``python -m outlier_admin.demo``: the whole product on one machine, no services needed.

See :mod:`outlier_admin.demo.config` for the environment variables, :mod:`outlier_admin.demo.fleet`
for the simulated fleet (the simulator's vLLM V1 step engines and the real traces, run in real time) and
:mod:`outlier_admin.demo.runner` for what runs where.
"""
