import os

import django
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

if settings.SERVER_ROLE == "api":
    from gpustack_models.api.server import APIHandler

    application = APIHandler()
else:
    from django.core.handlers.asgi import ASGIHandler

    application = ASGIHandler()
