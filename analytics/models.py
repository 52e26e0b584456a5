"""What the node measured: one row per request and per model load.

These rows feed the cost fits (lending), so they are recorded exactly: the work a request did
(tokens, image pixels * steps * n), how long it took, and whether it succeeded.
"""

from __future__ import annotations

from django.db import models


class RequestRecord(models.Model):
    """One finished request (success or not) on this node."""

    node_id = models.CharField(max_length=64)
    model_id = models.CharField(max_length=255, help_text="Local model ID (image ID for images).")
    config_filename = models.CharField(max_length=255, blank=True, default="")
    lane = models.CharField(max_length=16)
    path = models.CharField(max_length=128, blank=True, default="")
    status = models.PositiveSmallIntegerField(default=0)
    success = models.BooleanField(default=False)
    borrowed = models.BooleanField(default=False)
    stream = models.BooleanField(default=False)
    prompt_bytes = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0,
        help_text="Prompt tokens the backend reused from its prompt cache "
        "(usage.prompt_tokens_details.cached_tokens); they cost it no prefill.",
    )
    output_tokens = models.PositiveIntegerField(default=0)
    image_width = models.PositiveIntegerField(default=0)
    image_height = models.PositiveIntegerField(default=0)
    image_steps = models.PositiveIntegerField(default=0)
    image_count = models.PositiveIntegerField(default=0)
    duration_ms = models.FloatField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(db_index=True)
    request_id = models.CharField(
        max_length=128,
        null=True,
        blank=True,
        db_index=True,
        help_text="The request's X-Request-Id (the same on every node it passed through).",
    )
    key_name = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="The stored API key the request came with (the owner's key for a request "
        "lent here); null for a config-file key or a node without keys.",
    )

    class Meta:
        db_table = "analytics_requests"
        indexes = [models.Index(fields=["model_id", "lane", "finished_at"])]

    def __str__(self) -> str:
        return f"{self.model_id} {self.lane} {self.duration_ms:.0f}ms"


class LoadRecord(models.Model):
    """One model load attempt on this node."""

    node_id = models.CharField(max_length=64)
    model_id = models.CharField(max_length=255)
    config_filename = models.CharField(max_length=255)
    lane = models.CharField(max_length=16)
    reason = models.CharField(max_length=32, default="own")
    success = models.BooleanField(default=True)
    error = models.TextField(blank=True, default="")
    duration_ms = models.FloatField()
    finished_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "analytics_loads"
        indexes = [models.Index(fields=["config_filename", "finished_at"])]

    def __str__(self) -> str:
        return f"load {self.config_filename} {self.duration_ms:.0f}ms"
