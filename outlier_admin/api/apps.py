from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "outlier_admin.api"
    label = "api"
    verbose_name = "REST API"

    def ready(self) -> None:
        from outlier_admin.api import schema  # noqa: F401  (registers the OpenAPI auth extension)
