"""Who may use the cluster (stored API keys) and what was changed by whom (the audit log).

Table names are part of the public surface (operators query them directly), so every model
sets `db_table`. Keys live on the master (or a standalone node); slaves hold only the hashes the
master pushes, in memory.
"""

from __future__ import annotations

from django.db import models


class ApiKey(models.Model):
    """One named key. The secret is never stored: only its SHA-256 and a short visible prefix."""

    ROLE_INFERENCE = "inference"
    ROLE_ADMIN = "admin"
    ROLES = ((ROLE_INFERENCE, "inference"), (ROLE_ADMIN, "admin"))

    name = models.CharField(max_length=64, unique=True)
    key_hash = models.CharField(
        max_length=64, unique=True, help_text="Hex SHA-256 of the secret; the secret is shown once."
    )
    key_prefix = models.CharField(max_length=16, help_text="The secret's first characters.")
    role = models.CharField(max_length=16, choices=ROLES, default=ROLE_INFERENCE)
    # `models` in the API and the table; the attribute name keeps Django's `models` module usable.
    allowed_models = models.JSONField(
        null=True,
        blank=True,
        db_column="models",
        help_text="Public model IDs this key may ask for; null = all.",
    )
    rpm = models.PositiveIntegerField(null=True, blank=True)
    tpm = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    share = models.FloatField(default=1.0)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "access_api_keys"
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}…)"


class AuditEntry(models.Model):
    """One management write: who did what to which thing, with the state before and after."""

    at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=512, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    node_id = models.CharField(max_length=64, blank=True, default="")
    request_id = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        db_table = "audit_log"
        ordering = ("-at", "-id")
        indexes = [
            models.Index(fields=["actor", "at"]),
            models.Index(fields=["action", "at"]),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"
