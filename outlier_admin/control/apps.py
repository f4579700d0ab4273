from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "outlier_admin.control"
    label = "control"
    verbose_name = "Control: detector ticks, history, transitions, overrides, canaries, audit"

    def ready(self) -> None:
        from django.core import checks

        from outlier_admin.control.checks import (
            check_tick_timing,
            refuse_bad_sentinel,
            refuse_bad_tick_timing,
        )

        checks.register(check_tick_timing)
        # Gateways fail open if a crashed worker's groups stay silent past stale_after_s: refuse to
        # start with such a timing (see control.checks for the rule).
        refuse_bad_tick_timing()
        # A redis+sentinel:// REDIS_URL whose Sentinels name no primary: say so now, not at the first command.
        refuse_bad_sentinel()
