"""Guardian settings: the in-memory snapshot every router process routes with, and its store.

The master (or a standalone node) keeps the rows in its database and pushes the snapshot to
every slave, like links and lending settings, so a client that talks to a slave directly gets
the same guardian the master would pick (when the guardian is one of the slave's own models).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from routerproject.errors import RouterError

SCOPES = ("cluster", "node", "model")


@dataclass(frozen=True)
class Guardians:
    cluster: str | None = None
    nodes: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, str] = field(default_factory=dict)

    def for_model(self, public_id: str, node_id: str) -> str | None:
        """The guardian for `public_id` served on `node_id`: model, then node, then cluster."""
        found = self.models.get(public_id) or self.nodes.get(node_id) or self.cluster
        # A model never guards itself: a multimodal model set as the node's or the cluster's
        # guardian would otherwise "reroute" its own refusals back to itself.
        return None if found == public_id else found

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "nodes": dict(sorted(self.nodes.items())),
            "models": dict(sorted(self.models.items())),
        }

    def as_audit(self) -> dict[str, Any]:
        """As the audit log keeps it: IDs as values, never as field names (the log drops fields
        named like secrets, and a model may well be called `embed-key-v2`)."""
        return {
            "cluster": self.cluster,
            "nodes": [{"node_id": k, "guardian_id": v} for k, v in sorted(self.nodes.items())],
            "models": [{"model_id": k, "guardian_id": v} for k, v in sorted(self.models.items())],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Guardians:
        """Parse a pushed snapshot; a malformed one raises RouterError and changes nothing."""
        cluster = doc.get("cluster")
        if cluster is not None and (not isinstance(cluster, str) or not cluster):
            raise RouterError(400, "cluster must be a model ID or null", param="cluster")
        scoped: dict[str, dict[str, str]] = {}
        for name in ("nodes", "models"):
            value = doc.get(name, {})
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
            ):
                raise RouterError(400, f"{name} must map IDs to model IDs", param=name)
            scoped[name] = dict(value)
        return cls(cluster=cluster, nodes=scoped["nodes"], models=scoped["models"])


def guardians_load() -> Guardians:
    from guardians.models import GuardianSetting

    cluster: str | None = None
    nodes: dict[str, str] = {}
    models: dict[str, str] = {}
    for scope, key, guardian_id in GuardianSetting.objects.values_list(
        "scope", "key", "guardian_id"
    ):
        if scope == "cluster":
            cluster = guardian_id
        elif scope == "node":
            nodes[key] = guardian_id
        elif scope == "model":
            models[key] = guardian_id
    return Guardians(cluster=cluster, nodes=nodes, models=models)


@dataclass(frozen=True)
class Change:
    scope: str
    key: str
    guardian_id: str | None
    """None clears the setting."""


def guardians_apply(changes: Iterable[Change]) -> None:
    """Write every change or none."""
    from guardians.models import GuardianSetting

    with transaction.atomic():
        for change in changes:
            if change.guardian_id is None:
                GuardianSetting.objects.filter(scope=change.scope, key=change.key).delete()
            else:
                GuardianSetting.objects.update_or_create(
                    scope=change.scope,
                    key=change.key,
                    defaults={"guardian_id": change.guardian_id},
                )
