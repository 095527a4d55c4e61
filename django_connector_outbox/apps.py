from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ConnectorOutboxConfig(AppConfig):
    name = "django_connector_outbox"
    verbose_name = _("Connector outbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_connector_outbox import checks, immediate, signals  # noqa: F401  (registers them)
