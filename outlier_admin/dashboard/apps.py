from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "outlier_admin.dashboard"
    label = "dashboard"
    verbose_name = "Operator dashboard"
