from django.db import models


class TeamRole(models.TextChoices):
    RESEARCHER = "researcher", "Researcher"
    ADMIN = "admin", "Team admin"
