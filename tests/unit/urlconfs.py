"""The root URLconf (``config.urls``) as a process of a given role loads it: the role is read once, when the
URLconf is imported, so each role's URLconf is loaded here into a module of its own."""

import importlib.util
from types import ModuleType

from django.test import override_settings


def for_role(role: str) -> ModuleType:
    """``config.urls`` as loaded with ``GPUSTACK_SERVER_ROLE=role``; pass it to ``resolve(..., urlconf=)``."""
    spec = importlib.util.find_spec("config.urls")
    module = importlib.util.module_from_spec(spec)
    with override_settings(SERVER_ROLE=role):
        spec.loader.exec_module(module)
    return module
