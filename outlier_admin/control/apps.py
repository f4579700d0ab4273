from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "outlier_admin.control"
    label = "control"
    verbose_name = "Control: detector ticks, history, transitions, overrides, canaries, audit"
