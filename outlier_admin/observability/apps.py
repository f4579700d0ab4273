from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "outlier_admin.observability"
    label = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Celery workers expose their own /metrics (see worker_metrics); connecting here is free
        # in processes that never start a worker.
        from contract.topology import on_redirection
        from outlier_admin.control.signals import tick_done
        from outlier_admin.observability import tasks, worker_metrics  # tasks: registers the Celery task
        from outlier_admin.observability.hooks import on_tick_done
        from outlier_admin.observability.metrics import count_redirection

        del tasks
        worker_metrics.connect()
        tick_done.connect(on_tick_done, dispatch_uid="observability.on_tick_done")
        on_redirection(count_redirection)  # a Redis Cluster client's MOVED/ASK, whoever built it
