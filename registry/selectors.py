"""Read-side queries over registry tables."""

from __future__ import annotations

from registry.identity import Assignment, IdentityKey
from registry.models import ModelState, PublicIdAssignment


def public_id_assignments() -> dict[IdentityKey, Assignment]:
    return {
        (row.node_id, row.local_id, row.identity): Assignment(
            node_id=row.node_id,
            local_id=row.local_id,
            identity=row.identity,
            public_id=row.public_id,
        )
        for row in PublicIdAssignment.objects.all()
    }


def disabled_models() -> set[str]:
    """Local IDs of this node's models that are disabled."""
    return set(ModelState.objects.values_list("local_id", flat=True))
