"""Usage: requests, errors, tokens, backend time and lent requests, grouped by key, model, node
and day, over the whole cluster (`GET /router/v1/site/usage`).

Each node sums its own rows in its database (`usage_local`, one GROUP BY over a time range) and
the master merges what every node answers (`usage_merge`). A request has exactly one row, on the
node whose backend answered it: a node that forwards a request to another or lends it to a
helper records nothing of its own for it (proxy/forwarding/local.py). So `requests` counts
each request once, lent ones on their helper, and `lent` is how many of those the helper ran
for another node's model (`borrowed` rows): a part of `requests`, never added to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from analytics.ports import AnalyticsNode
from registry.nodeclient import NodeCallError
from routerproject.errors import RouterError

NODE_USAGE_PATH = "/router/v1/node/usage"
DIMENSIONS = ("key", "model", "node", "day")
# The answer's field for each dimension (the contract's names).
FIELD_OF = {"key": "key_name", "model": "model", "node": "node_id", "day": "day"}
MEASURES = ("requests", "errors", "prompt_tokens", "completion_tokens", "backend_ms", "lent")
DEFAULT_GROUP_BY = ("key",)
DEFAULT_RANGE_MS = 30 * 86_400_000
# datetime's own limit (year 9999): a later bound cannot be a row's time.
MAX_MS = 253_402_300_799_999


@dataclass(frozen=True)
class UsageQuery:
    since_ms: int
    until_ms: int
    group_by: tuple[str, ...]

    def params(self) -> dict[str, str]:
        """The query again, for the node protocol."""
        return {
            "since_ms": str(self.since_ms),
            "until_ms": str(self.until_ms),
            "group_by": ",".join(self.group_by),
        }


def _ms(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) > MAX_MS:
        raise RouterError(
            400, f"{name} must be a whole number of milliseconds since 1970", param=name
        )
    return int(raw)


def _group_by(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return DEFAULT_GROUP_BY
    wanted: list[str] = []
    for part in raw.split(","):
        name = part.strip()
        if name not in DIMENSIONS:
            raise RouterError(
                400,
                f"group_by: {name!r} is not one of {', '.join(DIMENSIONS)}",
                param="group_by",
            )
        if name not in wanted:
            wanted.append(name)
    return tuple(wanted)


def parse_usage_query(query: Mapping[str, str], *, now_ms: int) -> UsageQuery:
    """The query of a usage request; 400 naming the parameter at fault.

    Without `until_ms` the range ends now; without `since_ms` it starts 30 days before its end.
    Both bounds are inclusive.
    """
    until = _ms(query, "until_ms")
    since = _ms(query, "since_ms")
    group_by = _group_by(query.get("group_by"))
    if until is None:
        until = max(now_ms, since or 0)
    if since is None:
        since = max(0, until - DEFAULT_RANGE_MS)
    if since > until:
        raise RouterError(400, "since_ms must not be after until_ms", param="since_ms")
    return UsageQuery(since, until, group_by)


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def usage_local(*, node_id: str, query: UsageQuery) -> list[dict[str, Any]]:
    """This node's own rows in the range, summed in the database by the query's dimensions.

    A row keeps the node and, when grouped by model, the local model ID and lane: only the
    master knows the public ID they have in the cluster (`usage_merge` maps them).
    """
    from django.db.models import Count, Q, Sum
    from django.db.models.functions import TruncDate

    from analytics.models import RequestRecord

    rows = RequestRecord.objects.filter(
        node_id=node_id,
        finished_at__gte=_when(query.since_ms),
        finished_at__lte=_when(query.until_ms),
    )
    fields = ["node_id"]
    if "key" in query.group_by:
        fields.append("key_name")
    if "model" in query.group_by:
        fields += ["model_id", "lane"]
    if "day" in query.group_by:
        rows = rows.annotate(day=TruncDate("finished_at", tzinfo=UTC))
        fields.append("day")
    grouped = (
        rows.values(*fields)
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=Q(success=False)),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("output_tokens"),
            backend_ms=Sum("duration_ms"),
            lent=Count("id", filter=Q(borrowed=True)),
        )
        .order_by(*fields)
    )
    out = []
    for row in grouped:
        if "day" in row:
            row["day"] = row["day"].isoformat()
        for name in MEASURES:
            row[name] = row[name] or 0
        out.append(row)
    return out


PublicIds = Mapping[tuple[str, str, str], str]


def public_ids(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(node, local ID, lane) → the public ID the cluster serves that model under, from the
    master's merged view; an image row's model is the image ID, so it maps to the public image
    ID."""
    found: dict[tuple[str, str, str], str] = {}
    for rec in records:
        node_id, local_id = str(rec.get("node_id", "")), str(rec.get("local_id", ""))
        if rec.get("public_id"):
            for lane in ("text", "whisper"):
                found[(node_id, local_id, lane)] = str(rec["public_id"])
        if rec.get("image_id") and rec.get("public_image_id"):
            found[(node_id, str(rec["image_id"]), "image")] = str(rec["public_image_id"])
    return found


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def usage_merge(
    per_node: Mapping[str, list[dict[str, Any]]], *, query: UsageQuery, names: PublicIds
) -> list[dict[str, Any]]:
    """Every node's rows summed into the query's groups: only the grouped fields and the
    measures, in the order of the grouped fields."""
    totals: dict[tuple[Any, ...], dict[str, float]] = {}
    for node_id, rows in per_node.items():
        for row in rows:
            values = {
                "key": row.get("key_name"),
                "node": node_id,
                "day": row.get("day"),
                "model": _model(node_id, row, names),
            }
            group = tuple(values[name] for name in query.group_by)
            into = totals.setdefault(group, dict.fromkeys(MEASURES, 0.0))
            for name in MEASURES:
                into[name] += _number(row.get(name))
    out = []
    for group in sorted(totals, key=lambda g: tuple("" if v is None else str(v) for v in g)):
        merged: dict[str, Any] = {
            FIELD_OF[n]: v for n, v in zip(query.group_by, group, strict=True)
        }
        for name, value in totals[group].items():
            merged[name] = round(value, 1) if name == "backend_ms" else int(value)
        out.append(merged)
    return out


def _model(node_id: str, row: Mapping[str, Any], names: PublicIds) -> str | None:
    local = row.get("model_id")
    if not isinstance(local, str):
        return None
    # A model the cluster no longer lists keeps the ID it had on its node.
    return names.get((node_id, local, str(row.get("lane", ""))), local)


async def usage_site(node: AnalyticsNode, query: UsageQuery) -> dict[str, Any]:
    """The cluster's usage: this node's rows and every registered node's, asked concurrently
    with one deadline; a node that does not answer in time is listed in `node_errors`."""
    from channels.db import database_sync_to_async

    await node.recorder.flush()
    per_node: dict[str, list[dict[str, Any]]] = {
        node.node_id: await database_sync_to_async(usage_local)(node_id=node.node_id, query=query)
    }
    answers, errors = await _ask_nodes(node, query)
    per_node.update(answers)
    rows = usage_merge(per_node, query=query, names=public_ids(node.cluster.view.records))
    return {"rows": rows, "node_errors": errors}


async def _ask_nodes(
    node: AnalyticsNode, query: UsageQuery
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, str]]]:
    client = node.client
    remotes = sorted(node.cluster.nodes.values(), key=lambda n: n.node_id)
    if client is None or not remotes:
        return {}, []
    path = NODE_USAGE_PATH + "?" + "&".join(f"{k}={v}" for k, v in query.params().items())
    deadline = node.config.cluster.control_timeout

    async def one(node_id: str, url: str, healthy: bool) -> tuple[str, Any, str]:
        if not healthy:
            return node_id, None, "node is not healthy"
        try:
            return node_id, await client.call_ok("GET", url, path, timeout=deadline), ""
        except NodeCallError as exc:
            return node_id, None, str(exc)

    results = await asyncio.gather(*(one(n.node_id, n.node_url, n.healthy) for n in remotes))
    answers: dict[str, list[dict[str, Any]]] = {}
    errors: list[dict[str, str]] = []
    for node_id, doc, error in results:
        rows = doc.get("rows") if isinstance(doc, dict) else None
        if not error and not isinstance(rows, list):
            error = "answered usage this node cannot read"
        if error:
            errors.append({"node_id": node_id, "error": error})
            continue
        answers[node_id] = [r for r in rows or [] if isinstance(r, dict)]
    return answers, errors
