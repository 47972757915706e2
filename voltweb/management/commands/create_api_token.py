from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from voltweb import services


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it once (store it: it cannot be shown again)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="A label to recognise the token by.")

    def handle(self, username, name, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}; create one with `manage.py createsuperuser`.")
        issued = services.create_api_token(user, name)
        self.stdout.write(issued.secret)
