from django.apps import AppConfig


class LocalConfig(AppConfig):
    name = "gpustack_models.local"
    label = "gpustack_models_local"
    verbose_name = "gpustack-models: local development"
