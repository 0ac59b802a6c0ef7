from django.apps import AppConfig


class GpustackModelsConfig(AppConfig):
    name = "gpustack_models"
    verbose_name = "GPUStack models"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings

        if settings.SERVER_ROLE == "api":
            from gpustack_models.api.server import quiet_request_signals

            quiet_request_signals()
