from django.apps import AppConfig


class VoltwebConfig(AppConfig):
    name = "voltweb"
    verbose_name = "Volt accounts"
