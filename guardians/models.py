"""Guardian settings: which multimodal text model answers image requests for a text-only one.

One row per scope and key; the most specific row wins when a request is routed (model, then
node, then cluster). The master's database is the source of truth; slaves run what it pushes.
"""

from __future__ import annotations

from django.db import models


class GuardianSetting(models.Model):
    class Scope(models.TextChoices):
        CLUSTER = "cluster", "cluster"
        NODE = "node", "node"
        MODEL = "model", "model"

    scope = models.CharField(max_length=8, choices=Scope.choices)
    key = models.CharField(
        max_length=255,
        blank=True,
        help_text="Empty for the cluster scope; a node ID or a public model ID otherwise.",
    )
    guardian_id = models.CharField(
        max_length=255, help_text="Public ID of a multimodal text model."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "guardian_settings"
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="uniq_guardian_scope_key")
        ]

    def __str__(self) -> str:
        where = self.scope if self.scope == self.Scope.CLUSTER else f"{self.scope} {self.key}"
        return f"{where} → {self.guardian_id}"
