from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "outlier_admin.fleet"
    label = "fleet"
    verbose_name = "Fleet: model groups, nodes, thresholds, tokens"

    def ready(self) -> None:
        from django.core import checks

        from outlier_admin.fleet.checks import check_client_addresses, check_trusted_proxies_in_kubernetes

        # The client address the login throttle keys on (fleet.checks): warnings at start-up.
        checks.register(check_client_addresses, checks.Tags.security, checks.Tags.database)
        checks.register(check_trusted_proxies_in_kubernetes, checks.Tags.security)
