"""The cluster registry held by the router process: nodes, their snapshots, health, the merged view.

On a master it holds every slave's last accepted snapshot and whether the node is healthy
(health means: the last poll, or a push registration, succeeded). Every change rebuilds the
merged view (registry/identity.py) that routing reads; a slave or standalone node's view holds
only its own models. The state is rebuilt from polls after a restart; only the public-ID
assignments are persisted (so suffixes are stable), through the `on_assignments` callback.

Snapshot validation lives here too, so a malformed or conflicting snapshot is refused before
anything changes: a refused snapshot leaves the revision, the view and the allow-list as they
were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from registry.identity import Assignment, IdentityKey, MergedView, merge
from registry.kcpps import ModelConfig
from registry.nodeclient import AllowList, normalize_base_url

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
MINIMUM_PROTOCOL_VERSION = 2
MAX_MODELS_PER_NODE = 10_000


class SnapshotRejected(Exception):
    """A registration or poll answer that must not change the registry."""

    def __init__(
        self, status: int, code: str, message: str, *, type: str = "cluster_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.type = type


@dataclass
class RemoteNode:
    node_id: str
    node_url: str
    records: list[dict[str, Any]]
    build_version: str = ""
    healthy: bool = True
    error: str = ""
    updated_at: float = field(default_factory=time.time)
    role: str = "slave"
    accepted_at: float = field(default_factory=time.monotonic)
    """When this snapshot was taken in (monotonic): a poll sent before it is older news."""
    suspect: bool = False
    """Unhealthy because it stopped answering (no poll answer in time, or a refused
    connection), rather than because it answered wrongly: requests it holds that have heard
    nothing from it for a poll deadline are cut off instead of waiting for the request timeout."""


class Replica(NamedTuple):
    """One place a public model ID can be served.

    A NamedTuple rather than a frozen dataclass: the registry builds one per record on every
    rebuild, and tuple construction is several times cheaper.
    """

    public_id: str
    node_id: str
    local_id: str
    node_url: str
    available: bool
    record: Mapping[str, Any]
    cfg: ModelConfig | None = None
    """The local config when the replica is on this node."""

    @property
    def is_local(self) -> bool:
        return self.cfg is not None


def parse_snapshot(doc: Any) -> tuple[str, str, list[dict[str, Any]], str]:
    """Validate a snapshot (register body or node/models answer); return id, url, models, build."""
    if not isinstance(doc, dict):
        raise SnapshotRejected(400, "invalid_snapshot", "snapshot must be a JSON object")
    version = doc.get("protocol_version", 0)
    raw_build = doc.get("build_version")
    build = raw_build if isinstance(raw_build, str) else ""
    node_id = doc.get("node_id")
    if not isinstance(node_id, str) or not node_id.strip():
        raise SnapshotRejected(400, "invalid_snapshot", "node id is required")
    node_id = node_id.strip()
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or version < MINIMUM_PROTOCOL_VERSION
    ):
        raise SnapshotRejected(
            409,
            "incompatible_protocol",
            f"node {node_id!r} (build {build or 'unknown'}) speaks cluster protocol "
            f"{version!r}; this node needs at least {MINIMUM_PROTOCOL_VERSION}: update the node",
        )
    node_url = doc.get("node_url")
    if not isinstance(node_url, str) or not node_url.strip():
        raise SnapshotRejected(400, "invalid_snapshot", "node url is required")
    models = doc.get("models", [])
    if not isinstance(models, list) or len(models) > MAX_MODELS_PER_NODE:
        raise SnapshotRejected(400, "invalid_snapshot", "models must be a list of model records")
    clean: list[dict[str, Any]] = []
    for i, rec in enumerate(models):
        if not isinstance(rec, dict):
            raise SnapshotRejected(400, "invalid_snapshot", f"models[{i}] must be an object")
        for key in ("local_id", "model_hash", "config_hash"):
            if not isinstance(rec.get(key, ""), str):
                raise SnapshotRejected(
                    400, "invalid_snapshot", f"models[{i}].{key} must be a string"
                )
        if not rec.get("local_id"):
            raise SnapshotRejected(400, "invalid_snapshot", f"models[{i}].local_id is required")
        clean.append(dict(rec))
    return node_id, node_url.strip(), clean, build


def _enabled_first(replicas: list[Replica]) -> list[Replica]:
    # Model lists describe a public ID by its first replica: a model disabled on one node but
    # served by another must be listed, from a replica that serves it.
    if any(r.record.get("disabled") for r in replicas):
        replicas.sort(key=lambda r: bool(r.record.get("disabled")))
    return replicas


class ClusterState:
    """Registry state of one router process (master, slave or standalone)."""

    def __init__(
        self,
        *,
        role: str,
        node_id: str,
        public_url: str,
        slave_urls: Sequence[str],
        local_records: Callable[[], list[dict[str, Any]]],
        local_configs: Callable[[], Mapping[str, ModelConfig]],
        assignments: Mapping[IdentityKey, Assignment] | None = None,
        on_assignments: Callable[[dict[IdentityKey, Assignment]], None] | None = None,
        health_timeout: float = 3.0,
    ) -> None:
        self.role = role
        self.health_timeout = health_timeout
        """The per-node poll deadline (`cluster.health_timeout`)."""
        self.node_id = node_id
        self.public_url = normalize_base_url(public_url) if public_url else ""
        self.slave_urls = [normalize_base_url(u) for u in slave_urls]
        self._slave_url_set = set(self.slave_urls)
        self._local_records = local_records
        self._local_configs = local_configs
        self.nodes: dict[str, RemoteNode] = {}
        self.assignments: dict[IdentityKey, Assignment] = dict(assignments or {})
        self._on_assignments = on_assignments
        self.revision = 0
        self.routing_allow = AllowList([u for u in (public_url,) if u])
        self.view: MergedView
        self.by_public_id: dict[str, list[Replica]] = {}
        self.by_public_image_id: dict[str, list[Replica]] = {}
        self._rr: dict[str, int] = {}
        self.health_listeners: list[Callable[[str, bool], None]] = []
        """Told (node ID, healthy) after every poll or registration outcome of a node. Upper
        layers register here (lending returns work lent to a node that stopped answering):
        the registry must not import them."""
        self.suspect_listeners: list[Callable[[str], None]] = []
        """Told the URL of a node marked suspect between polls (the poll loop re-polls it)."""
        self.view_ready = role != "master"
        """False on a master until its first round of polls has finished or timed out: until
        then a model missing from the view may just be on a slave not heard from yet."""
        self.rebuild()

    # -- snapshots ------------------------------------------------------------------------

    def _check_owner(self, node_id: str, url: str) -> None:
        if node_id == self.node_id or (self.public_url and url == self.public_url):
            raise SnapshotRejected(
                409, "duplicate_node", f"node {node_id!r} at {url} duplicates this master"
            )
        held = self.nodes.get(node_id)
        if held is not None and held.node_url != url:
            raise SnapshotRejected(
                409,
                "duplicate_node",
                f"node id {node_id!r} is already registered from {held.node_url}",
            )
        for other in self.nodes.values():
            if other.node_url == url and other.node_id != node_id:
                raise SnapshotRejected(
                    409,
                    "duplicate_node",
                    f"node url {url} is already registered by node {other.node_id!r}",
                )

    def register(self, doc: Any) -> RemoteNode:
        """A slave's push registration. Raises SnapshotRejected and changes nothing on refusal."""
        if self.role != "master":
            raise SnapshotRejected(
                400, "not_master", "cluster registry is not enabled on this node"
            )
        node_id, raw_url, models, build = parse_snapshot(doc)
        try:
            url = normalize_base_url(raw_url)
        except ValueError as exc:
            raise SnapshotRejected(400, "invalid_snapshot", f"node url {raw_url!r}: {exc}") from exc
        if url not in self._slave_url_set:
            raise SnapshotRejected(
                400, "not_configured", f"node url {raw_url} is not configured in cluster.slave_urls"
            )
        self._check_owner(node_id, url)
        return self._accept(node_id, url, models, build)

    def apply_poll(self, url: str, doc: Any) -> RemoteNode:
        """A successful poll of `url`: the polled URL wins over the one the node reports."""
        node_id, _reported, models, build = parse_snapshot(doc)
        self._check_owner(node_id, url)
        return self._accept(node_id, url, models, build)

    def _accept(
        self, node_id: str, url: str, models: list[dict[str, Any]], build: str
    ) -> RemoteNode:
        for rec in models:
            rec["node_id"] = node_id
            rec["node_url"] = url
            rec["source"] = "slave"
            rec["public_id"] = rec["local_id"]
            if rec.get("image_id"):
                rec["public_image_id"] = rec["image_id"]
            if not rec.get("backend_mode"):
                rec["backend_mode"] = "kobold"
            rec["available"] = True
        held = self.nodes.get(node_id)
        if (
            held is not None
            and held.healthy
            and held.node_url == url
            and held.build_version == build
            and held.records == models
        ):
            # The answer of most polls: nothing changed. A rebuild costs time in the number of
            # records of the whole cluster, so rebuilding on each of N polls a round would make
            # the round cost N² (seconds at a thousand nodes); the view is already this one.
            held.updated_at = time.time()
            held.accepted_at = time.monotonic()
            self._tell_health(node_id, True)
            return held
        node = RemoteNode(node_id, url, models, build_version=build)
        self.nodes[node_id] = node
        self.routing_allow.add(url)
        self.rebuild()
        self._tell_health(node_id, True)
        return node

    def mark_unhealthy(self, url: str, error: str, *, suspect: bool = False) -> list[str]:
        """A failed poll: every node registered from `url` turns unavailable.

        `suspect`: the node did not answer at all (see RemoteNode.suspect).
        """
        changed = []
        failed = []
        for node in self.nodes.values():
            if node.node_url != url:
                continue
            failed.append(node.node_id)
            if node.healthy or node.error != error or node.suspect != suspect:
                node.healthy = False
                node.error = error
                node.suspect = suspect
                for rec in node.records:
                    rec["available"] = False
                changed.append(node.node_id)
        if changed:
            self.rebuild()
        # Every failure is told, not only a change: a listener may have been told since that
        # the node answers something else.
        for node_id in failed:
            self._tell_health(node_id, False)
        return changed

    def mark_suspect(self, url: str, error: str) -> list[str]:
        """A request could not reach the node at `url`: skip it for routing until it answers a
        poll again, and have it re-polled now rather than at the next round."""
        changed = self.mark_unhealthy(url, error, suspect=True)
        for listener in list(self.suspect_listeners):
            try:
                listener(url)
            except Exception:
                logger.exception("suspect listener failed for %s", url)
        return changed

    def _tell_health(self, node_id: str, healthy: bool) -> None:
        for listener in list(self.health_listeners):
            try:
                listener(node_id, healthy)
            except Exception:
                # A listener's bug must not stop the registry from recording health.
                logger.exception("health listener failed for node %s", node_id)

    def node_for_url(self, url: str) -> RemoteNode | None:
        return next((n for n in self.nodes.values() if n.node_url == url), None)

    # -- the merged view --------------------------------------------------------------------

    def rebuild(self) -> None:
        local = self._local_records()
        # Each node's records carry their `available` flag already (set when health changes),
        # so they go to the merge as they are: the merge copies them once itself.
        remote = {node.node_id: node.records for node in self.nodes.values()}
        view = merge(local, remote, previous=self.assignments)
        if view.assignments != self.assignments:
            self.assignments = dict(view.assignments)
            if self._on_assignments is not None:
                self._on_assignments(self.assignments)
        self.view = view
        configs = self._local_configs()
        me = self.node_id
        made: dict[int, Replica] = {}
        for rec in view.records:
            node_id = rec.get("node_id", "")
            local_id = rec["local_id"]
            made[id(rec)] = Replica(
                rec["public_id"],
                node_id,
                local_id,
                rec.get("node_url", ""),
                rec.get("available", True) is not False,
                rec,
                configs.get(local_id) if node_id == me and rec.get("source") != "slave" else None,
            )
        self.by_public_id = {
            pid: _enabled_first([made[id(rec)] for rec in recs])
            for pid, recs in view.by_public_id.items()
        }
        self.by_public_image_id = {
            pid: _enabled_first([made[id(rec)] for rec in recs])
            for pid, recs in view.by_public_image_id.items()
        }
        self.revision += 1

    def next_rr(self, key: str, *, advance: bool = True) -> int:
        """The round-robin counter of `key`; `advance=False` reads it without taking a turn."""
        turn = self._rr.get(key, 0)
        if advance:
            self._rr[key] = turn + 1
        return turn

    def records(self) -> list[dict[str, Any]]:
        return [dict(rec) for rec in self.view.records]

    def node_summaries(self) -> list[dict[str, Any]]:
        return [
            {
                "node_id": n.node_id,
                "node_url": n.node_url,
                "healthy": n.healthy,
                "suspect": n.suspect,
                "error": n.error,
                "build_version": n.build_version,
                "models": len(n.records),
                "updated_at": n.updated_at,
            }
            for n in sorted(self.nodes.values(), key=lambda n: n.node_id)
        ]
