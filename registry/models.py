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
