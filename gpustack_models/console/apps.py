from django.contrib.admin.apps import AdminConfig


class ConsoleAdminConfig(AdminConfig):
    """The admin application with the console's site (its dashboard and tenant pages) as the default site."""

    default_site = "gpustack_models.console.site.ConsoleSite"
