"""Routing links (owner → helper, per lane): validation, candidates, saving, snapshots.

A link is one-way: the owner may lend held requests to the helper. Links never change where a
request is routed; they only enroll both models in the router queue. Links are chosen by hand;
the picker labels every candidate (same weights or not, text eligibility) and lists ineligible
ones with the reason instead of hiding them.

Endpoints are identified by (node ID, model ID): the local model ID on the text lane, the image
ID on the image lane. Model data comes from the master's registry view (records of every node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from lending.models import ImageLink, TextLink
from lending.pricing import LANES, Lane
from registry.eligibility import text_pair_ineligible_reason
from routerproject.errors import RouterError

LINK_FIELDS = (
    "owner_node_id",
    "owner_model_id",
    "helper_node_id",
    "helper_model_id",
    "load_if_unloaded",
    "restore_after_borrow",
)


def link_model(lane: Lane) -> type[ImageLink] | type[TextLink]:
    return ImageLink if lane == "image" else TextLink


@dataclass(frozen=True)
class Endpoint:
    node_id: str
    model_id: str
    record: Mapping[str, Any]

    @property
    def model_hash(self) -> str:
        return str(self.record.get("model_hash", ""))


def lane_endpoints(
    records: Iterable[Mapping[str, Any]], lane: Lane
) -> dict[tuple[str, str], Endpoint]:
    """Every model of the lane in the registry view, keyed by (node_id, model_id)."""
    out: dict[tuple[str, str], Endpoint] = {}
    for rec in records:
        if rec.get("disabled"):
            continue
        node_id = str(rec.get("node_id", ""))
        if lane == "image":
            image_id = rec.get("image_id")
            if rec.get("has_image") and image_id:
                out[(node_id, str(image_id))] = Endpoint(node_id, str(image_id), rec)
        elif rec.get("has_llm"):
            out[(node_id, str(rec["local_id"]))] = Endpoint(node_id, str(rec["local_id"]), rec)
    return out


def pair_ineligible_reason(lane: Lane, a: Endpoint, b: Endpoint) -> str | None:
    """Why two models cannot be linked on `lane` (None: they can); the rule is pure, in
    registry/eligibility.py."""
    if lane != "text":
        return None
    return text_pair_ineligible_reason(a.record, b.record)


def links_all(lane: Lane) -> list[dict[str, Any]]:
    rows = link_model(lane).objects.order_by(
        "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id"
    )
    return [row.as_dict() for row in rows]


def links_snapshot() -> dict[str, list[dict[str, Any]]]:
    """The full link set of both lanes, as the master pushes it to slaves."""
    return {lane: links_all(lane) for lane in LANES}


def _touching(lane: Lane, node_id: str, model_id: str) -> Any:
    from django.db.models import Q

    return link_model(lane).objects.filter(
        Q(owner_node_id=node_id, owner_model_id=model_id)
        | Q(helper_node_id=node_id, helper_model_id=model_id)
    )


def links_touching(*, lane: Lane, node_id: str, model_id: str) -> list[dict[str, Any]]:
    """Every link of the lane that the model is the owner or the helper of."""
    return [row.as_dict() for row in _touching(lane, node_id, model_id)]


def links_for_anchor(
    *, lane: Lane, anchor: Endpoint, endpoints: Mapping[tuple[str, str], Endpoint]
) -> dict[str, Any]:
    """The anchor's links and every candidate on other nodes, labelled."""
    links = [row.as_dict() for row in _touching(lane, anchor.node_id, anchor.model_id)]
    lends = {
        (ln["helper_node_id"], ln["helper_model_id"]): ln
        for ln in links
        if ln["owner_node_id"] == anchor.node_id and ln["owner_model_id"] == anchor.model_id
    }
    borrows = {
        (ln["owner_node_id"], ln["owner_model_id"]): ln
        for ln in links
        if ln["helper_node_id"] == anchor.node_id and ln["helper_model_id"] == anchor.model_id
    }
    candidates = []
    for key, end in sorted(endpoints.items()):
        if end.node_id == anchor.node_id:
            continue
        cand: dict[str, Any] = {
            "node_id": end.node_id,
            "model_id": end.model_id,
            "public_id": end.record.get("public_image_id" if lane == "image" else "public_id"),
            "weights_match": bool(anchor.model_hash) and end.model_hash == anchor.model_hash,
            "lends_to": _selection(lends.get(key)),
            "borrows_from": _selection(borrows.get(key)),
        }
        if lane == "text":
            reason = pair_ineligible_reason(lane, anchor, end)
            cand["context_size"] = end.record.get("context_size")
            cand["eligible"] = reason is None
            cand["ineligible_reason"] = reason
        candidates.append(cand)
    return {
        "anchor": {"node_id": anchor.node_id, "model_id": anchor.model_id},
        "links": links,
        "candidates": candidates,
    }


def _selection(link: Mapping[str, Any] | None) -> dict[str, Any]:
    if link is None:
        return {"selected": False, "load_if_unloaded": True, "restore_after_borrow": False}
    return {
        "selected": True,
        "load_if_unloaded": bool(link["load_if_unloaded"]),
        "restore_after_borrow": bool(link["restore_after_borrow"]),
    }


@dataclass(frozen=True)
class LinkSpec:
    owner: Endpoint
    helper: Endpoint
    load_if_unloaded: bool
    restore_after_borrow: bool


def resolve_anchor(
    endpoints: Mapping[tuple[str, str], Endpoint], node_id: str, model_id: str, lane: Lane
) -> Endpoint:
    end = endpoints.get((node_id, model_id))
    if end is None:
        raise RouterError(
            400,
            f"unknown {lane} model {node_id}/{model_id}",
            param="anchor",
            code="unknown_model",
        )
    return end


def link_set_resolve(
    *,
    lane: Lane,
    endpoints: Mapping[tuple[str, str], Endpoint],
    anchor: tuple[str, str],
    lends_to: Sequence[Mapping[str, Any]],
    borrows_from: Sequence[Mapping[str, Any]],
) -> tuple[Endpoint, list[LinkSpec]]:
    """The anchor and links of a well-formed link set, checked against the cluster view.

    Every link is checked before any is saved: an unknown or ineligible model, a model on the
    anchor's own node or a duplicate refuses the whole set, naming the entry at fault.
    """
    anchor_end = resolve_anchor(endpoints, *anchor, lane)
    specs: list[LinkSpec] = []
    seen: set[tuple[str, str, str, str]] = set()
    for field, items in (("lends_to", lends_to), ("borrows_from", borrows_from)):
        for i, item in enumerate(items):
            where = f"{field}[{i}]"
            node_id, model_id = item["node_id"], item["model_id"]
            other = endpoints.get((node_id, model_id))
            if other is None:
                raise RouterError(
                    400,
                    f"{where}: unknown {lane} model {node_id}/{model_id}",
                    param=where,
                    code="unknown_model",
                )
            if other.node_id == anchor_end.node_id:
                raise RouterError(
                    400,
                    f"{where}: {node_id}/{model_id} is on the anchor's own node; links join "
                    "models on different nodes",
                    param=where,
                )
            reason = pair_ineligible_reason(lane, anchor_end, other)
            if reason:
                raise RouterError(
                    400, f"{where}: not eligible: {reason}", param=where, code="ineligible_model"
                )
            owner, helper = (anchor_end, other) if field == "lends_to" else (other, anchor_end)
            key = (owner.node_id, owner.model_id, helper.node_id, helper.model_id)
            if key in seen:
                raise RouterError(400, f"{where}: duplicate link", param=where)
            seen.add(key)
            specs.append(
                LinkSpec(owner, helper, item["load_if_unloaded"], item["restore_after_borrow"])
            )
    return anchor_end, specs


def links_replace(
    *, lane: Lane, anchor: Endpoint, specs: Sequence[LinkSpec], acknowledged: bool
) -> list[dict[str, Any]]:
    """Replace every link touching the anchor with `specs` (one transaction)."""
    model = link_model(lane)
    with transaction.atomic():
        existing = {
            (r.owner_node_id, r.owner_model_id, r.helper_node_id, r.helper_model_id)
            for r in _touching(lane, anchor.node_id, anchor.model_id)
        }
        for spec in specs:
            key = (
                spec.owner.node_id,
                spec.owner.model_id,
                spec.helper.node_id,
                spec.helper.model_id,
            )
            differs = not spec.owner.model_hash or spec.owner.model_hash != spec.helper.model_hash
            if key not in existing and differs and not acknowledged:
                raise RouterError(
                    400,
                    f"{spec.owner.node_id}/{spec.owner.model_id} and "
                    f"{spec.helper.node_id}/{spec.helper.model_id} have different weights: clients "
                    "may get different answers for one model ID. Send "
                    '"acknowledge_different_weights": true to link them anyway.',
                    code="different_weights",
                    param="acknowledge_different_weights",
                )
        _touching(lane, anchor.node_id, anchor.model_id).delete()
        for s in specs:
            model.objects.create(
                owner_node_id=s.owner.node_id,
                owner_model_id=s.owner.model_id,
                helper_node_id=s.helper.node_id,
                helper_model_id=s.helper.model_id,
                load_if_unloaded=s.load_if_unloaded,
                restore_after_borrow=s.restore_after_borrow,
            )
    return [row.as_dict() for row in _touching(lane, anchor.node_id, anchor.model_id)]


def links_delete(*, lane: Lane, node_id: str, model_id: str) -> int:
    deleted, _ = _touching(lane, node_id, model_id).delete()
    return deleted


def parse_snapshot(doc: Any) -> dict[str, list[dict[str, Any]]]:
    """Validate a pushed link snapshot `{"image": [link], "text": [link]}` (slave side)."""
    if not isinstance(doc, dict):
        raise RouterError(400, "link snapshot must be a JSON object")
    out: dict[str, list[dict[str, Any]]] = {}
    for lane in LANES:
        items = doc.get(lane, [])
        if not isinstance(items, list):
            raise RouterError(400, f"{lane} must be a list of links", param=lane)
        clean = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise RouterError(400, f"{lane}[{i}] must be an object", param=lane)
            link: dict[str, Any] = {}
            for key in LINK_FIELDS[:4]:
                value = item.get(key)
                if not isinstance(value, str) or not value:
                    raise RouterError(
                        400, f"{lane}[{i}].{key} is required", param=f"{lane}[{i}].{key}"
                    )
                link[key] = value
            link["load_if_unloaded"] = item.get("load_if_unloaded", True) is not False
            link["restore_after_borrow"] = item.get("restore_after_borrow", False) is True
            clean.append(link)
        out[lane] = clean
    return out
