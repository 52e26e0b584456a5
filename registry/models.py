"""Registry state that must survive a restart: public-ID assignments (stable suffixes)."""

from __future__ import annotations

from django.db import models


class PublicIdAssignment(models.Model):
    """The public ID given to one (node, local model, identity): suffixes never move once given."""

    node_id = models.CharField(max_length=64)
    local_id = models.CharField(max_length=255)
    identity = models.CharField(max_length=300)
    public_id = models.CharField(max_length=300)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "registry_public_ids"
        constraints = [
            models.UniqueConstraint(
                fields=["node_id", "local_id", "identity"], name="uniq_public_id_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node_id}/{self.local_id} → {self.public_id}"


class ModelState(models.Model):
    """A model of this node that its operator disabled; a model without a row is enabled.

    Each node keeps its own models' states in its own database, so a slave's choice survives
    the slave's restart whatever its master does; the master learns it from the snapshot.
    """

    local_id = models.CharField(max_length=255, primary_key=True)
    disabled_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "model_states"

    def __str__(self) -> str:
        return f"{self.local_id} disabled"


class ModelAsset(models.Model):
    """A file of this node whose SHA-256 was verified: what portable references resolve to.

    One hash may sit at several paths (a file root and the shared dir); each row says how and
    when its content was checked, so a peer or an operator can tell a copy from its source.
    """

    sha256 = models.CharField(max_length=64, db_index=True)
    filename = models.CharField(max_length=255)
    size = models.BigIntegerField()
    path = models.TextField()
    verification_source = models.CharField(max_length=32)
    verified_at = models.DateTimeField()

    class Meta:
        db_table = "model_assets"
        constraints = [
            models.UniqueConstraint(fields=["sha256", "path"], name="uniq_model_asset_path")
        ]

    def __str__(self) -> str:
        return f"{self.sha256[:12]} {self.filename}"


class HfAssetOrigin(models.Model):
    """Where on a Hugging Face hub the bytes of one hash can be fetched, once verified there:
    the revision resolved to `commit` and the file's LFS hash was `sha256`."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    repository = models.CharField(max_length=200)
    repository_path = models.CharField(max_length=1000)
    commit = models.CharField(max_length=64)
    bound_at = models.DateTimeField()

    class Meta:
        db_table = "model_asset_hf_origins"

    def __str__(self) -> str:
        return f"{self.sha256[:12]} hf://{self.repository}@{self.commit}/{self.repository_path}"
