from django.apps import AppConfig


class GpustackModelsConfig(AppConfig):
    name = "gpustack_models"
    verbose_name = "GPUStack models"
    default_auto_field = "django.db.models.BigAutoField"
