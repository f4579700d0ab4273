from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "outlier_admin.fleet"
    label = "fleet"
    verbose_name = "Fleet: model groups, nodes, thresholds, tokens"
