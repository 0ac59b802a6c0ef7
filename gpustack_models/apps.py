from django.apps import AppConfig
from django.conf import settings


class GpustackModelsConfig(AppConfig):
    name = "gpustack_models"
    verbose_name = "GPUStack models"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        if settings.SERVER_ROLE == "api":
            # The one project import inside a function in this process: Django imports this module while it
            # loads the apps, before the API's modules may be imported, and calls ``ready`` once they may;
            # only the API process imports its server (the console never does), and publishes the CA
            # certificates nodes trust when it is asked to (``internal.ca_bundle``).
            from gpustack_models.api.server import quiet_request_signals
            from gpustack_models.internal.ca_bundle import start

            quiet_request_signals()
            start()
