"""Lending configuration (links, settings overrides) and history (the decision log).

Table names are part of the public surface (operators query them directly), so every model
sets `db_table`.
"""

from __future__ import annotations

from django.db import models

from lending.decisions import FOLD_SIGNATURE


class LinkBase(models.Model):
    """One-way link: the owner may lend held requests to the helper. The reverse is separate."""

    owner_node_id = models.CharField(max_length=64)
    owner_model_id = models.CharField(max_length=255)
    helper_node_id = models.CharField(max_length=64)
    helper_model_id = models.CharField(max_length=255)
    load_if_unloaded = models.BooleanField(
        default=True, help_text="The helper may load the linked model to take lent work."
    )
    restore_after_borrow = models.BooleanField(
        default=False, help_text="The helper reloads the model it held before, once quiet."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return (
            f"{self.owner_node_id}/{self.owner_model_id} → "
            f"{self.helper_node_id}/{self.helper_model_id}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "owner_node_id": self.owner_node_id,
            "owner_model_id": self.owner_model_id,
            "helper_node_id": self.helper_node_id,
            "helper_model_id": self.helper_model_id,
            "load_if_unloaded": self.load_if_unloaded,
            "restore_after_borrow": self.restore_after_borrow,
        }


class ImageLink(LinkBase):
    """Image-lane link; model IDs are image IDs."""

    class Meta:
        db_table = "routing_links_image"
        constraints = [
            models.UniqueConstraint(
                fields=["owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id"],
                name="uniq_image_link",
            )
        ]


class TextLink(LinkBase):
    """Text-lane (LLM) link; model IDs are local model IDs."""

    class Meta:
        db_table = "routing_links_text"
        constraints = [
            models.UniqueConstraint(
                fields=["owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id"],
                name="uniq_text_link",
            )
        ]


class LegacyRoutingGroupMember(models.Model):
    """A member of a symmetric routing group from an earlier release (converted on upgrade)."""

    lane = models.CharField(max_length=8, choices=[("image", "image"), ("text", "text")])
    group_id = models.CharField(max_length=64)
    node_id = models.CharField(max_length=64)
    model_id = models.CharField(max_length=255)
    restore_after_borrow = models.BooleanField(default=False)

    class Meta:
        db_table = "routing_groups_legacy"

    def __str__(self) -> str:
        return f"{self.lane}:{self.group_id} {self.node_id}/{self.model_id}"


class OffloadSetting(models.Model):
    """A database override of one lending setting (stored as its canonical string)."""

    key = models.CharField(max_length=64, primary_key=True)
    value = models.TextField()
    updated_at = models.BigIntegerField(help_text="Unix time in milliseconds.")

    class Meta:
        db_table = "offload_settings"

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class OffloadDecision(models.Model):
    """One lending decision: a plan row (master), dispatch row (owner) or helper row."""

    recorded_at = models.BigIntegerField(db_index=True, help_text="Unix time in milliseconds.")
    node_id = models.CharField(max_length=64, default="")
    kind = models.CharField(max_length=16, default="")
    trigger = models.CharField(max_length=32, default="")
    lane = models.CharField(max_length=8, default="")
    owner_node_id = models.CharField(max_length=64, default="")
    owner_model_id = models.CharField(max_length=255, default="")
    helper_node_id = models.CharField(max_length=64, default="")
    helper_model_id = models.CharField(max_length=255, default="")
    outcome = models.CharField(max_length=32, default="")
    reason = models.CharField(max_length=64, default="")
    pending_count = models.IntegerField(default=0)
    backlog_count = models.IntegerField(default=0)
    keep_ms = models.FloatField(default=0)
    switch_ms = models.FloatField(default=0)
    restore_ms = models.FloatField(default=0)
    service_ms = models.FloatField(default=0)
    owner_job_ms = models.FloatField(default=0)
    service_source = models.CharField(max_length=16, default="")
    helper_idle_ms = models.BigIntegerField(default=0)
    slots = models.IntegerField(default=0)
    lent_out = models.IntegerField(default=0)
    borrowed_ahead = models.IntegerField(default=0)
    wait_ms = models.BigIntegerField(default=0)
    router_version = models.CharField(max_length=32, default="")
    request_id = models.CharField(
        max_length=128,
        null=True,
        blank=True,
        db_index=True,
        help_text="The X-Request-Id of the request the row is about; null for plans and leases.",
    )
    key_name = models.CharField(
        max_length=200,
        null=True,
        blank=True,
        help_text="The stored API key the request came with (its owner's, when lent); null for "
        "rows about no request and for requests without a stored key.",
    )

    class Meta:
        db_table = "offload_decisions"
        indexes = [models.Index(fields=["-recorded_at"], name="offload_dec_recorded_desc")]

    def __str__(self) -> str:
        return f"{self.kind}/{self.outcome} {self.owner_model_id}→{self.helper_model_id}"


# What the rollup and the signatures table are unique on (the rollup per minute bucket
# besides): a fold's signature, and the trigger each fold counts apart.
_FOLD_KEY = (*FOLD_SIGNATURE, "trigger")


class _FoldSignature(models.Model):
    """The columns that name a fold: what the rollup and the signature table are keyed by."""

    node_id = models.CharField(max_length=64, default="")
    kind = models.CharField(max_length=16, default="")
    lane = models.CharField(max_length=8, default="")
    owner_node_id = models.CharField(max_length=64, default="")
    owner_model_id = models.CharField(max_length=255, default="")
    helper_node_id = models.CharField(max_length=64, default="")
    helper_model_id = models.CharField(max_length=255, default="")
    outcome = models.CharField(max_length=32, default="")
    reason = models.CharField(max_length=64, default="")
    trigger = models.CharField(max_length=32, default="")

    class Meta:
        abstract = True


class OffloadDecisionFold(_FoldSignature):
    """The decision log rolled up: one row per fold signature, trigger and minute.

    Kept by the database itself (triggers on `offload_decisions`, migration 0004), so every
    writer keeps it in step: the router's flush, an import, a test's factory. A page of folds
    reads these rows instead of grouping a million decision rows.
    """

    bucket_ms = models.BigIntegerField(help_text="Start of the minute (Unix ms) of the rows.")
    n = models.BigIntegerField(default=0)
    first_at = models.BigIntegerField(default=0)
    last_at = models.BigIntegerField(default=0)
    version_min = models.CharField(max_length=32, default="")
    version_max = models.CharField(max_length=32, default="")
    source_min = models.CharField(max_length=16, default="")
    source_max = models.CharField(max_length=16, default="")
    request_min = models.CharField(max_length=128, null=True, blank=True)
    request_max = models.CharField(max_length=128, null=True, blank=True)
    key_min = models.CharField(max_length=200, null=True, blank=True)
    key_max = models.CharField(max_length=200, null=True, blank=True)
    pending_count_min = models.BigIntegerField(default=0)
    pending_count_max = models.BigIntegerField(default=0)
    backlog_count_min = models.BigIntegerField(default=0)
    backlog_count_max = models.BigIntegerField(default=0)
    keep_ms_min = models.FloatField(default=0)
    keep_ms_max = models.FloatField(default=0)
    switch_ms_min = models.FloatField(default=0)
    switch_ms_max = models.FloatField(default=0)
    restore_ms_min = models.FloatField(default=0)
    restore_ms_max = models.FloatField(default=0)
    service_ms_min = models.FloatField(default=0)
    service_ms_max = models.FloatField(default=0)
    owner_job_ms_min = models.FloatField(default=0)
    owner_job_ms_max = models.FloatField(default=0)
    helper_idle_ms_min = models.BigIntegerField(default=0)
    helper_idle_ms_max = models.BigIntegerField(default=0)
    slots_min = models.BigIntegerField(default=0)
    slots_max = models.BigIntegerField(default=0)
    lent_out_min = models.BigIntegerField(default=0)
    lent_out_max = models.BigIntegerField(default=0)
    borrowed_ahead_min = models.BigIntegerField(default=0)
    borrowed_ahead_max = models.BigIntegerField(default=0)
    wait_ms_min = models.BigIntegerField(default=0)
    wait_ms_max = models.BigIntegerField(default=0)

    class Meta:
        db_table = "offload_decision_folds"
        constraints = [
            models.UniqueConstraint(
                fields=[*_FOLD_KEY, "bucket_ms"],
                name="uniq_decision_fold",
            )
        ]
        indexes = [models.Index(fields=["bucket_ms"], name="offload_fold_bucket")]

    def __str__(self) -> str:
        return f"{self.kind}/{self.outcome} x{self.n} @{self.bucket_ms}"


class OffloadDecisionSignature(_FoldSignature):
    """Each fold signature and trigger the decision log holds: its rows and its newest row.

    Kept by the same triggers as the rollup (migration 0005). A page of folds walks these few
    rows and reads each one's minutes of the window from the rollup's unique index, instead of
    sorting every rollup row of the window into groups.
    """

    n = models.BigIntegerField(default=0)
    last_at = models.BigIntegerField(
        default=0, help_text="Unix ms of the newest row (not lowered when rows are deleted)."
    )

    class Meta:
        db_table = "offload_decision_signatures"
        constraints = [
            models.UniqueConstraint(
                fields=list(_FOLD_KEY),
                name="uniq_decision_signature",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.outcome}/{self.trigger} x{self.n}"
