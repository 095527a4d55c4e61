from django.apps import AppConfig


class ConnectorOutboxConfig(AppConfig):
    name = "django_connector_outbox"
    verbose_name = "Connector outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_connector_outbox import checks, signals  # noqa: F401  (registers them)
