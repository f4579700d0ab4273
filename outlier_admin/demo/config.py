"""Demo configuration from the environment (pure: no Django import).

==========================  =======  =========================================================
``PORT``                    8000     dashboard / API / ``/metrics`` on 127.0.0.1:PORT
``DEMO_BIND``               127.0.0.1 address the web server binds (``0.0.0.0`` in a container)
``DEMO_SECONDS``            0        exit by itself after N seconds (0: run until Ctrl-C)
``DEMO_FAULT_AT_S``         60       thermal throttle (3x slower) on node 5 of the large group
``DEMO_PCIE_AT_S``          FAULT+15 PCIe downgrade (decode 2.5x, prefill 1.5x) on node 2 of the small group
``DEMO_HEAL_AT_S``          FAULT+180  both faults heal (canaries then pass, stepwise restore)
``DEMO_HEAL_AFTER_PROBES``  -        both faults heal as soon as the throttled node has failed N canary
                                     probes, if that is before DEMO_HEAL_AT_S (the first hour's faults)
``DEMO_TICK_S``             1.0      detector tick period of the demo loop
``DEMO_CANARY_INTERVAL_S``  -        canary probe interval of both groups (unset: the ``canary_interval_s``
                                     threshold); a quarantine's first probe waits it too, so a short one
                                     shows the probe cycles in seconds
``DEMO_RATE_RPS``           128,16   client requests per second of the two groups (4 and 2 per node)
``DEMO_SMALL_POLICY``       approval policy of the small group (``approval``: its quarantine waits for you)
``DEMO_SEED``               7        random seed of the workload and node speeds
``DEMO_PASSWORD``           random   password of the demo operator ``demo``
``DATABASE_URL``            -        unset: a fresh SQLite file ``demo.sqlite3``; set: that database
``REDIS_URL``               -        used when reachable, else an in-process stand-in (fakeredis)
==========================  =======  =========================================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from detector.thresholds import ThresholdError, Thresholds


class DemoConfigError(ValueError):
    """A demo environment variable has a value that cannot be used (the message names it)."""


@dataclass(frozen=True)
class DemoConfig:
    port: int = 8000
    seconds: float = 0.0
    fault_at_s: float = 60.0
    pcie_at_s: float = 75.0
    heal_at_s: float = 240.0
    tick_s: float = 1.0
    canary_interval_s: float | None = None
    heal_after_probes: int | None = None
    rate_large: float = 128.0
    rate_small: float = 16.0
    small_policy: str = "approval"
    seed: int = 7
    password: str | None = None
    bind: str = "127.0.0.1"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DemoConfig:
        env = os.environ if env is None else env

        def num(name: str, default: float, *, lo: float = 0.0) -> float:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                raise DemoConfigError(f"{name}={raw!r} is not a number") from None
            if value < lo:
                raise DemoConfigError(f"{name}={raw!r} must be >= {lo}")
            return value

        fault = num("DEMO_FAULT_AT_S", 60.0)
        pcie = num("DEMO_PCIE_AT_S", fault + 15.0)
        heal = num("DEMO_HEAL_AT_S", max(fault, pcie) + 180.0)
        if heal <= max(fault, pcie):
            raise DemoConfigError(f"DEMO_HEAL_AT_S={heal:g} must be after the faults start ({max(fault, pcie):g} s)")
        rates = (env.get("DEMO_RATE_RPS") or "128,16").split(",")
        if len(rates) != 2:
            raise DemoConfigError(f"DEMO_RATE_RPS={env.get('DEMO_RATE_RPS')!r} must be two numbers: LARGE,SMALL")
        try:
            large, small = (float(x) for x in rates)
        except ValueError:
            raise DemoConfigError(f"DEMO_RATE_RPS={env.get('DEMO_RATE_RPS')!r} must be two numbers") from None
        if large <= 0 or small <= 0:
            raise DemoConfigError("DEMO_RATE_RPS values must be > 0")
        policy = env.get("DEMO_SMALL_POLICY") or "approval"
        if policy not in ("shadow", "approval", "auto"):
            raise DemoConfigError(f"DEMO_SMALL_POLICY={policy!r} must be shadow, approval or auto")
        port = int(num("PORT", 8000, lo=1))
        if port > 65535:
            raise DemoConfigError(f"PORT={port} must be <= 65535")
        tick = num("DEMO_TICK_S", 1.0, lo=0.1)
        canary = num("DEMO_CANARY_INTERVAL_S", math.nan)
        if not math.isnan(canary):
            try:  # the threshold's own range, checked before anything starts
                Thresholds(canary_interval_s=canary)
            except ThresholdError as exc:
                raise DemoConfigError(f"DEMO_CANARY_INTERVAL_S={canary:g}: {exc.message}") from None
        probes = num("DEMO_HEAL_AFTER_PROBES", math.nan, lo=1)
        if not (math.isnan(probes) or probes.is_integer()):
            raise DemoConfigError(f"DEMO_HEAL_AFTER_PROBES={probes:g} must be a whole number of probes")
        return cls(port=port, seconds=num("DEMO_SECONDS", 0.0), fault_at_s=fault, pcie_at_s=pcie, heal_at_s=heal,
                   tick_s=tick, canary_interval_s=None if math.isnan(canary) else canary,
                   heal_after_probes=None if math.isnan(probes) else int(probes), rate_large=large,
                   rate_small=small, small_policy=policy,
                   seed=int(num("DEMO_SEED", 7)), password=env.get("DEMO_PASSWORD") or None,
                   bind=env.get("DEMO_BIND") or "127.0.0.1")
