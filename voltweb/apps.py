from django.apps import AppConfig


class VoltwebConfig(AppConfig):
    name = "voltweb"
    verbose_name = "Volt accounts"

    def ready(self):
        from voltweb import checks  # noqa: F401 - registers the deployment checks
        from voltweb.api import schema  # noqa: F401 - registers the OpenAPI auth extension
