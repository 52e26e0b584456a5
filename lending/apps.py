from __future__ import annotations

from django.apps import AppConfig


class LendingConfig(AppConfig):
    name = "lending"
    default_auto_field = "django.db.models.BigAutoField"
