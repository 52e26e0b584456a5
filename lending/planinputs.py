"""The planner's inputs on the master, rebuilt only where they changed since the last plan.

A plan needs, per lane, every owner with its link targets (each model an ``Endpoint`` built
from the registry record and its node's runtime status) and the cost table merged from every
node's published fits. At a thousand nodes and ten thousand links, building all of that again
costs more than the plan itself, and an event changes a few nodes' status only (under
``cluster.lending_event_poll: linked`` only those are polled again; the others keep their
status object). So:

* the link index (which owner links to which helper, with the pair checks of the registry
  records) is rebuilt when the links or the records change;
* a model's endpoint is rebuilt when its node's status is another object than last time, and
  only the owners whose own or helpers' endpoints were rebuilt get their targets again;
* a node's fits are parsed again only when its published costs differ, and the cost table is
  the same object as last time when no node's costs changed.

The result is what building everything afresh gives, object for object equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analytics.fitting import CostFit, fits_from_wire
from lending.planner import Endpoint, LinkTarget
from lending.pricing import CostTable, Lane
from registry.eligibility import record_text_ineligible_reason

__all__ = ["CostCache", "LaneInputs", "endpoint_of"]

Key = tuple[str, str]  # (node_id, model_id)
Owners = list[tuple[Endpoint, list[LinkTarget]]]


def _queue(lane: str, model_id: str, status: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(
        (
            q
            for q in status.get(f"{lane}_queue", []) or []
            if isinstance(q, dict) and q.get("model_id") == model_id
        ),
        {},
    )


def _lendable(queue: Mapping[str, Any]) -> int:
    # An owner build that does not report it counts every held request as lendable.
    return int(queue.get("lendable_count", queue.get("pending_count", 0)) or 0)


def endpoint_of(
    lane: str, record: Mapping[str, Any], model_id: str, status: Mapping[str, Any]
) -> Endpoint:
    """One model as the planner sees it, from its registry record and its node's status."""
    config = str(record.get("filename", ""))
    active_text = status.get("active_text_config", "")
    active_image = status.get("active_image_config", "")
    loaded = config == (active_image if lane == "image" else active_text)
    held = [c for c in (active_text, active_image) if isinstance(c, str) and c and c != config]
    queue = _queue(lane, model_id, status)
    context = record.get("context_size")
    return Endpoint(
        node_id=str(record.get("node_id", "")),
        model_id=model_id,
        config_filename=config,
        loaded=loaded,
        accepting_borrowed=bool(status.get(f"accepting_borrowed_{lane}")),
        idle_for_ms=float(status.get("idle_for_ms", 0) or 0),
        context_capacity=context if isinstance(context, int) else 0,
        eligible=lane != "text" or record_text_ineligible_reason(record) is None,
        pending_count=int(queue.get("pending_count", 0)),
        lendable_count=_lendable(queue),
        pending_work=tuple(queue.get("pending_work", ())),
        pending_context=int(queue.get("pending_context", 0)),
        sized_count=int(queue.get("sized_count", 0)),
        sized_work=tuple(queue.get("sized_work", ())),
        sized_context=int(queue.get("sized_context", 0)),
        backlog_count=int(queue.get("backlog_count", 0)),
        backlog_work=tuple(queue.get("backlog_work", ())),
        # An owner build that does not report them has no cached prefixes to take out.
        sized_cached=tuple(queue.get("sized_cached", ())),
        backlog_cached=tuple(queue.get("backlog_cached", ())),
        displaced_configs=() if loaded else tuple(dict.fromkeys(held)),
    )


class CostCache:
    """Every node's published fits merged into one table, parsed again only where they changed."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[Any, dict[tuple[str, str], CostFit], dict[str, float]]] = {}
        self._table: CostTable | None = None

    def table(self, statuses: Mapping[str, Mapping[str, Any]]) -> CostTable | None:
        """None when no node publishes costs yet."""
        parsed: dict[str, tuple[Any, dict[tuple[str, str], CostFit], dict[str, float]]] = {}
        changed = False
        for node_id, status in statuses.items():
            wire = status.get("costs")
            if not isinstance(wire, dict):
                continue
            last = self._parsed.get(node_id)
            if last is not None and (last[0] is wire or last[0] == wire):
                parsed[node_id] = last
                continue
            changed = True
            models, node_loads, _tokens = fits_from_wire(wire)
            parsed[node_id] = (wire, models, node_loads)
        changed = changed or parsed.keys() != self._parsed.keys()
        self._parsed = parsed
        if not parsed:
            self._table = None
        elif changed or self._table is None:
            fits: dict[tuple[str, str, str], CostFit] = {}
            loads: dict[tuple[str, str], float] = {}
            for node_id, (_, node_fits, node_loads) in parsed.items():
                for (model_id, section), fit in node_fits.items():
                    fits[(node_id, model_id, section)] = fit
                for config, ms in node_loads.items():
                    loads[(node_id, config)] = ms
            self._table = CostTable(fits=fits, loads=loads)
        return self._table


class LaneInputs:
    """One lane's owners and link targets, rebuilt where a node's status, a registry record or
    the links changed."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self._records: Sequence[Mapping[str, Any]] | None = None
        self._links: Sequence[Mapping[str, Any]] | None = None
        # owner -> [(helper, load_if_unloaded, restore_after_borrow)] of every link, in order.
        self._linked: dict[Key, list[tuple[Key, bool, bool]]] = {}
        self._linked_from: dict[Key, set[Key]] = {}  # helper -> the owners linking to it
        self._owners_on: dict[str, set[Key]] = {}  # node -> the owners it holds
        self._helped_from: dict[str, set[Key]] = {}  # helper node -> the owners linking to it
        # The same, less the links whose models are not both in the registry and eligible.
        self._targets: dict[Key, list[tuple[Key, bool, bool]]] = {}
        self._registry: dict[Key, Any] = {}  # the lane's models (lending.links.lane_endpoints)
        self._stale: set[Key] = set()  # owners whose records changed since the last owners()
        self._statuses: dict[str, Mapping[str, Any]] = {}
        self._endpoints: dict[str, dict[str, Endpoint]] = {}  # node -> model -> endpoint
        self._owners: dict[Key, tuple[Endpoint, list[LinkTarget]]] = {}

    def index(
        self, records: Sequence[Mapping[str, Any]], links: Sequence[Mapping[str, Any]]
    ) -> None:
        """Take the registry's records and the lane's links (equal contents in new objects
        change nothing). New links rebuild everything; a changed record (a model loaded, a
        node's health) only the owners of that model or linked to it."""
        if links is not self._links and links != self._links:
            self._relink(links)
        self._links = links
        if records is self._records or records == self._records:
            self._records = records
            return
        from lending.links import lane_endpoints

        self._records = records
        registry = lane_endpoints(records, self.lane)
        old = self._registry
        changed = [
            key
            for key in registry.keys() | old.keys()
            if key not in registry or key not in old or registry[key].record != old[key].record
        ]
        self._registry = registry
        for key in changed:
            self._endpoints.get(key[0], {}).pop(key[1], None)
            if key in self._linked:
                self._stale.add(key)
            self._stale.update(self._linked_from.get(key, ()))
        for owner in self._stale:
            self._retarget(owner)

    def _relink(self, links: Sequence[Mapping[str, Any]]) -> None:
        linked: dict[Key, list[tuple[Key, bool, bool]]] = {}
        for link in links:
            owner = (str(link["owner_node_id"]), str(link["owner_model_id"]))
            helper = (str(link["helper_node_id"]), str(link["helper_model_id"]))
            flags = (bool(link["load_if_unloaded"]), bool(link["restore_after_borrow"]))
            linked.setdefault(owner, []).append((helper, *flags))
        self._linked, self._linked_from = linked, {}
        self._owners_on, self._helped_from = {}, {}
        for owner, helpers in linked.items():
            self._owners_on.setdefault(owner[0], set()).add(owner)
            for helper, _, _ in helpers:
                self._linked_from.setdefault(helper, set()).add(owner)
                self._helped_from.setdefault(helper[0], set()).add(owner)
        self._targets, self._owners = {}, {}
        self._stale = set(linked)
        for owner in linked:
            self._retarget(owner)

    def _retarget(self, owner: Key) -> None:
        """The owner's links whose two models are in the registry and may be linked."""
        from lending.links import pair_ineligible_reason

        registry = self._registry
        targets = []
        mine = registry.get(owner)
        for helper, load, restore in self._linked.get(owner, ()) if mine is not None else ():
            theirs = registry.get(helper)
            assert mine is not None
            # A config that became ineligible is skipped at the next plan, not just at save.
            if theirs is not None and not pair_ineligible_reason(self.lane, mine, theirs):
                targets.append((helper, load, restore))
        if targets:
            self._targets[owner] = targets
        else:
            self._targets.pop(owner, None)

    def neighbourhood(self, owner: Key) -> set[str]:
        """The nodes a plan for ``owner`` can involve: the owner's, its helpers', and those of
        the owners that link to a helper on the same nodes (they claim the same helpers)."""
        helper_nodes = {node for (node, _), _, _ in self._linked.get(owner, [])}
        nodes = {owner[0], *helper_nodes}
        for node in helper_nodes:
            nodes.update(other[0] for other in self._helped_from.get(node, ()))
        return nodes

    def owners(self, statuses: Mapping[str, Mapping[str, Any]]) -> Owners:
        """Every owner with something to lend, a status and at least one helper with a status,
        targets in link order (as the planner wants them)."""
        changed = [
            node
            for node in statuses.keys() | self._statuses.keys()
            if statuses.get(node) is not self._statuses.get(node)
        ]
        dirty, self._stale = self._stale, set()
        for node in changed:
            dirty.update(self._owners_on.get(node, ()))
            dirty.update(self._helped_from.get(node, ()))
            self._endpoints.pop(node, None)
        self._statuses = dict(statuses)
        for owner in dirty:
            self._rebuild(owner, statuses)
        return list(self._owners.values())

    def _endpoint(self, key: Key, statuses: Mapping[str, Mapping[str, Any]]) -> Endpoint | None:
        node, model = key
        on_node = self._endpoints.setdefault(node, {})
        made = on_node.get(model)
        if made is None:
            status = statuses.get(node)
            if status is None:
                return None
            record = self._registry[key].record
            made = on_node[model] = endpoint_of(self.lane, record, model, status)
        return made

    def owner(
        self, key: Key, statuses: Mapping[str, Mapping[str, Any]]
    ) -> tuple[Endpoint, list[LinkTarget]] | None:
        """One owner and its link targets whatever it holds (`owners` leaves out an owner with
        nothing to lend; a lease it keeps is weighed with it: lending/carry.py). Call after
        `owners` with the same statuses."""
        built = self._owners.get(key)
        if built is not None:
            return built
        return self._build(key, statuses) if key[0] in statuses else None

    def _build(
        self, key: Key, statuses: Mapping[str, Mapping[str, Any]]
    ) -> tuple[Endpoint, list[LinkTarget]] | None:
        """The owner's endpoint and its targets with a status (None: no endpoint)."""
        if key not in self._targets:
            return None
        endpoint = self._endpoint(key, statuses)
        if endpoint is None:
            return None
        targets = []
        for helper, load, restore in self._targets[key]:
            made = self._endpoint(helper, statuses)
            if made is not None:
                targets.append(LinkTarget(made, load, restore))
        return endpoint, targets

    def _rebuild(self, owner: Key, statuses: Mapping[str, Mapping[str, Any]]) -> None:
        self._owners.pop(owner, None)
        status = statuses.get(owner[0])
        if (
            owner not in self._targets
            or status is None
            or _lendable(_queue(self.lane, owner[1], status)) <= 0
        ):
            # Nothing to lend: the planner passes it over (planned_owners), so neither its
            # endpoint nor its helpers' are built. At a thousand nodes most owners are idle.
            return
        built = self._build(owner, statuses)
        if built is not None and built[1]:
            self._owners[owner] = built
