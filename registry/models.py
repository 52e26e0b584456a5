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
