from __future__ import annotations

from django.apps import AppConfig


class GuardiansConfig(AppConfig):
    name = "guardians"
    default_auto_field = "django.db.models.BigAutoField"
