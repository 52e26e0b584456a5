"""Choosing the replica that serves a request for a public model ID.

A request always goes to a holder of the public ID it names: lending links never change this.
Among replicas of one public ID (same name, identical hashes) the choice follows the
reference's rotation, per lane:

1. a local replica that is idle on that lane and whose lane is ready (reference-cluster §3.3:
   a loaded backend that fails its readiness probe is skipped);
2. otherwise the available remote replicas, round-robin (one counter per public ID and lane);
3. otherwise a busy local replica (the request queues on its runtime);
4. otherwise nothing: 503 when replicas exist but every one is on an unhealthy node (fail fast,
   never hang), 502 when none can serve at all.

With `cluster.routing_cache_affinity` on, a request whose prompt prefix a replica served last
goes back to that replica when the prefill it saves outweighs its extra wait (see
registry/affinity.py); otherwise the rotation's pick stands.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

from registry.affinity import Fingerprint, PrefixMatch, ReplicaKey, prefers_cached
from registry.cluster import Replica
from registry.kcpps import Lane
from registry.ports import RoutingNode
from routerproject.errors import RouterError, echo

Kind = Literal["llm", "embeddings", "image", "voice", "speech"]

CAPABILITY = {
    "llm": "has_llm",
    "embeddings": "has_embeddings",
    "image": "has_image",
    "voice": "has_voice",
    "speech": "has_tts",
}


def not_found(model: str, models: Iterable[str] = ()) -> RouterError:
    """The 404 for an unknown model; `models` (those that exist) are listed in the answer."""
    err = RouterError(
        404, f'model "{echo(model)}" was not found', code="model_not_found", param="model"
    )
    err.models = tuple(models)
    return err


def models_for(node: RoutingNode, kind: Kind) -> list[str]:
    """The public IDs of the enabled models that can serve `kind`, sorted (an image model by
    its config's name, which requests may use as well as its image ID)."""
    flag = CAPABILITY[kind]
    return sorted(
        public_id
        for public_id, replicas in node.cluster.by_public_id.items()
        if any(r.record.get(flag) and not r.record.get("disabled") for r in replicas)
    )


def view_not_ready(node: RoutingNode) -> RouterError:
    """A restarted master has not heard from every slave yet: an unknown model may be theirs."""
    wait = max(1, math.ceil(node.cluster.health_timeout))
    return RouterError(
        503,
        "cluster view not ready: the master has not finished its first round of health polls",
        type="backend_error",
        code="cluster_not_ready",
        retry_after=wait,
    )


def require_view(node: RoutingNode) -> None:
    """Answers that list the cluster's models wait for the first poll round (503 until then)."""
    if not node.cluster.view_ready:
        raise view_not_ready(node)


def candidates(node: RoutingNode, public_id: str, kind: Kind) -> list[Replica]:
    view = node.cluster
    if kind == "image":
        found = view.by_public_image_id.get(public_id)
        if not found:
            # Clients often name the config rather than its derived image ID.
            found = view.by_public_id.get(public_id, [])
    else:
        found = view.by_public_id.get(public_id, [])
    flag = CAPABILITY[kind]
    return [r for r in found if r.record.get(flag) and not r.record.get("disabled")]


_LANE_OF_KIND: dict[str, Lane] = {
    "llm": "text",
    "embeddings": "text",
    "image": "image",
    "voice": "whisper",
    # Speech (TTS) uses text-side readiness, as the spec says.
    "speech": "text",
}


def lane_of(kind: Kind) -> Lane:
    return _LANE_OF_KIND[kind]


def choose(
    node: RoutingNode,
    public_id: str,
    kind: Kind,
    replicas: list[Replica],
    prefix: Sequence[Fingerprint] = (),
    match: PrefixMatch | None = None,
) -> Replica:
    if not (prefix and node.cache_affinity):
        return _rotate(node, public_id, kind, replicas)
    # A request sent back to the replica holding its prefix takes no turn of the rotation,
    # which then places new conversations in turn: one replica collecting most of them would
    # serve them from a cache too small to hold them all, and queue them behind each other.
    lane = lane_of(kind)
    picked = _rotate(node, public_id, kind, replicas, advance=False)
    chosen, steered = _affine(node, public_id, lane, replicas, prefix, picked, match)
    if not steered and not picked.is_local:
        node.cluster.next_rr(_rr_key(lane, public_id))
    return chosen


def _affine(
    node: RoutingNode,
    public_id: str,
    lane: Lane,
    replicas: list[Replica],
    prefix: Sequence[Fingerprint],
    picked: Replica,
    match: PrefixMatch | None = None,
) -> tuple[Replica, bool]:
    """The replica holding the longest cached prefix when that beats `picked` (the rotation's),
    and whether the choice was made for that prefix (False: the rotation's pick stands).

    `match`, when given, is told which replica was chosen for its cached prefix and how long
    that prefix is.

    Only replicas the rotation itself could pick qualify: a ready local lane, an available
    remote. Whatever is chosen is remembered as the holder of the request's whole prompt (its
    longest fingerprint) only: a shorter boundary such as a system prompt every conversation
    shares is cached on every replica that served any of them, and steering by its last
    holder would pile new conversations on one replica.
    """
    able: dict[ReplicaKey, Replica] = {
        ReplicaKey(r.node_id, r.local_id): r
        for r in replicas
        if (r.cfg is not None and node.lane_ready(r.cfg, lane)) or (not r.is_local and r.available)
    }

    def generation_of(key: ReplicaKey) -> int | None:
        if key not in able:
            return None
        return node.replica_generation(key.node_id, key.local_id, lane)

    table = node.affinity
    found = table.lookup(public_id, lane, prefix, generation_of)
    chosen = picked
    if found is None:
        table.count(public_id, "misses")
    else:
        chosen = _cached_or_picked(node, public_id, lane, prefix, found, able[found[0]], picked)
    steered = found is not None and ReplicaKey(chosen.node_id, chosen.local_id) == found[0]
    if found is not None and steered and match is not None:
        match.replica, match.prefix_bytes = found[0], found[1].prefix_bytes
    generation = node.replica_generation(chosen.node_id, chosen.local_id, lane)
    if generation is not None:
        table.remember(
            public_id, lane, prefix[-1:], ReplicaKey(chosen.node_id, chosen.local_id), generation
        )
    return chosen, steered


def _cached_or_picked(
    node: RoutingNode,
    public_id: str,
    lane: Lane,
    prefix: Sequence[Fingerprint],
    found: tuple[ReplicaKey, Fingerprint],
    cached: Replica,
    picked: Replica,
) -> Replica:
    """`cached`, the holder of the longest cached prefix (`found`), when sending the request
    to its cache beats the rotation's `picked`; else `picked`. Counts a hit or an override."""
    table = node.affinity
    holder, fp = found
    if cached is picked or ReplicaKey(picked.node_id, picked.local_id) == holder:
        table.count(public_id, "hits")
        return picked
    if prefers_cached(
        cached_tokens=fp.tokens,
        uncached_tokens=max(0, prefix[-1].tokens - fp.tokens),
        cost=node.prompt_cost(holder.node_id, holder.local_id, lane),
        cached_busy=node.busy[(cached.node_id, cached.local_id, lane)],
        other_busy=node.busy[(picked.node_id, picked.local_id, lane)],
    ):
        table.count(public_id, "hits")
        return cached
    table.count(public_id, "overrides")
    return picked


def _rr_key(lane: Lane, public_id: str) -> str:
    return f"{lane}:{public_id}"


def _rotate(
    node: RoutingNode, public_id: str, kind: Kind, replicas: list[Replica], advance: bool = True
) -> Replica:
    """The rotation's pick; `advance=False` leaves the round-robin turn to be taken later."""
    lane = lane_of(kind)
    # A local replica whose lane is not ready (a hung backend failing its probe) is skipped.
    local = [r for r in replicas if r.cfg is not None and node.lane_ready(r.cfg, lane)]
    for replica in local:
        if node.busy[(replica.node_id, replica.local_id, lane)] == 0:
            return replica
    remote = [r for r in replicas if not r.is_local and r.available]
    if remote:
        turn = node.cluster.next_rr(_rr_key(lane, public_id), advance=advance)
        return remote[turn % len(remote)]
    if local:
        return local[0]
    label = "image model" if kind == "image" else "model"
    if any(r.is_local for r in replicas):
        raise RouterError(
            503,
            f'{label} "{public_id}" is unavailable: its backend on this node is not ready',
            type="backend_error",
            code="backend_not_ready",
        )
    if replicas:
        down = sorted({r.node_id for r in replicas})
        raise RouterError(
            503,
            f'{label} "{public_id}" is unavailable: node {", ".join(down)} is not healthy',
            type="backend_error",
            code="node_unavailable",
        )
    raise RouterError(502, f'{label} "{public_id}" has no available replicas', type="backend_error")


def recipe_replica(node: RoutingNode, public_id: str, kind: Kind) -> Replica | None:
    """The replica of a split recipe's component for this kind of request, if one is named."""
    recipe = node.recipes.get(public_id)
    if recipe is None:
        return None
    comp = recipe.component(
        "voice" if kind in ("voice", "speech") else kind if kind != "llm" else "text"
    )
    if comp is None:
        raise not_found(public_id)
    wanted = comp.image_id if kind == "image" else comp.model_id
    table = node.cluster.by_public_image_id if kind == "image" else node.cluster.by_public_id
    for replicas in table.values():
        for replica in replicas:
            model = replica.record.get("image_id") if kind == "image" else replica.local_id
            if replica.node_id == comp.node_id and model == wanted:
                if replica.record.get("disabled"):
                    raise RouterError(
                        404, f'recipe "{recipe.id}" uses a disabled model', type="not_found"
                    )
                if not replica.available:
                    raise RouterError(
                        503,
                        f'recipe "{recipe.id}" needs node {comp.node_id}, which is not healthy',
                        type="backend_error",
                        code="node_unavailable",
                    )
                return replica
    raise RouterError(
        404, f'recipe "{recipe.id}" uses a model that is not available', type="not_found"
    )


def resolve(
    node: RoutingNode,
    public_id: str,
    kind: Kind,
    *,
    borrowed: bool = False,
    prefix: Sequence[Fingerprint] = (),
    match: PrefixMatch | None = None,
) -> Replica:
    if node.recipes and not borrowed:
        picked = recipe_replica(node, public_id, kind)
        if picked is not None:
            return picked
    replicas = candidates(node, public_id, kind)
    if borrowed:
        # Borrowed work is served here or handed back; it is never forwarded onward.
        replicas = [r for r in replicas if r.is_local]
        if not replicas:
            raise RouterError(
                409,
                f'model "{public_id}" is not served on this node',
                type="offload_returned",
                code="offload_returned",
            )
    if not replicas:
        if not node.cluster.view_ready:
            raise view_not_ready(node)
        raise _not_found_for(node, public_id, kind)
    return choose(node, public_id, kind, replicas, prefix, match)


# What a model that exists but lacks the capability asked for is told it cannot do.
_MISSING_CAPABILITY = {
    "image": "makes no images",
    "llm": "does not generate text",
    "embeddings": "makes no embeddings",
    "voice": "does not transcribe audio",
    "speech": "does not speak (no TTS model)",
}


def _not_found_for(node: RoutingNode, public_id: str, kind: Kind) -> RouterError:
    """The reference's 404; when the model exists but cannot do this, the message says so."""
    exists = [
        r
        for table in (node.cluster.by_public_id, node.cluster.by_public_image_id)
        for r in table.get(public_id, [])
        if not r.record.get("disabled")
    ]
    if not exists:
        return not_found(public_id, models_for(node, kind))
    return RouterError(
        404,
        f'model "{echo(public_id)}" was not found for this request: it exists but '
        f"{_MISSING_CAPABILITY[kind]}",
        code="model_not_found",
        param="model",
    )
