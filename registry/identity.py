"""Model identity: merge the master's model records with every slave's snapshot into one view.

Pure module (no Django, no I/O). ``merge`` is rebuilt on every registration and health
change; the caller persists the returned assignment table and hands it back as ``previous``.

Terms
-----
- *base id*: a record's ``local_id`` (the config file stem on its node).
- *identity*: ``identity_of(record)`` = ``"<model_hash>:<config_hash>"``. When both hashes are
  empty the identity is unknown, and the record gets ``"unknown:<node_id>:<local_id>"`` so
  that it never merges with a record of another node (reference §4.1 merged them; BEAT).
- *group*: all records with the same base id and the same identity. A group is one model;
  its records are replicas and share one public id.
- *key*: ``(node_id, local_id, identity)``; the assignment table maps keys to public ids.
- *rank* of a group: ``(0 if it holds a record passed in ``local`` else 1, smallest node_id)``.
  Only the argument a record came in through counts, never its ``source`` field, so a slave
  cannot claim the master's rank by lying about its source.
- A remote record's ``node_id`` is set to the ``remote`` mapping key it came under (the node
  that registered the snapshot), so a snapshot cannot file records under another node.
- *suffixed id* of base ``b``: ``b-N`` with N an integer >= 2 written without leading zeros.
  An id *belongs to* base ``b`` when it is ``b`` or a suffixed id of ``b``.

Public ids
----------
Base ids are processed independently (see "Why bases cannot collide" below). For each base,
its groups are sorted by rank and pass through four rounds; a group leaves at the first round
that gives it an id. A candidate id is *usable* by a group when it belongs to the group's base,
no other group has it in this view, and (unless it is the bare base id) it is not the base id
of any record in the view, so a real config named ``x-2`` is never shadowed.

1. *Kept*: the ids that ``previous`` gives the group's own keys. This round runs for every
   group of the base before any later round, so a model that already has an id keeps it no
   matter which nodes joined or left, or in what order they sort.
2. *Returning model*: ids of *dormant* entries (previous entries whose key is not in the
   view) with the same base id and identity, i.e. this model was known before, under a node
   that is now gone or no longer serves it.
3. *Edited config*: ids of dormant entries of one of the group's own nodes with the same base
   id but another identity, i.e. the node edited that config, so editing a config does not
   rename it. An id that a dormant entry of a node outside the group also holds is skipped:
   that model still exists on an absent node and keeps its name for when it returns.
4. *New*: the bare base id if no other group has it; otherwise the smallest ``base-N`` that is
   usable and not held by any dormant entry (reserved, so that a node which leaves and comes
   back finds its suffix still free; a dormant entry of the group's own identity was already
   offered in round 2).

Within rounds 1-3 the candidates are tried bare id first, then by ascending N. Consequences:
with no history, the group holding the master's own record gets the bare id and the others get
``-2``, ``-3``... in rank order, as in the reference. With history, an existing id outranks the
master's claim to the bare id: if a slave's ``x`` was public as ``x`` before the master gained a
different ``x``, the slave keeps ``x`` and the master's gets a suffix.

Bare ids are never reserved: a reserved bare id would leave a config without its own name
because some other node once had a config of that name. Round 1 runs for every group before
any id is handed out, so an id in use stays in use; reserving the ids of configs that a
present node has edited as well would rename an edited config on every edit (the master's
``x`` would become ``x-2``), which round 3 avoids by giving the id back to it.

Why bases cannot collide: an id belonging to ``b`` is ``b`` or ``b-<digits>``, so splitting at
the last ``-`` recovers ``b`` for any suffixed id; a suffixed id equal to another base id is
never usable; so two bases can never end up with the same public id.

Public image ids
----------------
For a record with a non-empty ``image_id``: when it starts with ``local_id + "-"``, that prefix
is replaced by ``public_id + "-"``; otherwise, if the public id equals the local id, the image id
is used as is; otherwise it becomes ``public_id + "-" + image_id``. A record without an image id
gets no ``public_image_id`` (a stale one sent by a slave is removed).

Assignment table
----------------
The returned table holds one entry per key in the view, plus every dormant entry that still
means something: a dormant entry is rewritten to its group's id when its (base, identity) is in
the view, dropped when its id now belongs to another model (or to a real config of that
name), and kept unchanged otherwise. Entries of a node that is deleted for good are therefore
kept; ``forget_node`` drops them. Feeding the returned table back with the same input gives
the same view and the same table (restart stability).

Records with the same public id and ``node_id:local_id`` (alias records of one config) are
ordered by their JSON content, so the view does not depend on input order.

Records are shallow copies: ``public_id``/``public_image_id`` are set on the copy, and nested
values (``capabilities``, ``options``) are shared with the input, for speed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

UNKNOWN_IDENTITY_PREFIX = "unknown:"
FIRST_SUFFIX_NUMBER = 2
# Rank order of where a record came from: the master's own records outrank every slave's.
ORIGIN_RANK_LOCAL = 0
ORIGIN_RANK_REMOTE = 1
# Sort position of the bare id among candidate ids (suffix numbers start at 2).
BARE_ID_ORDER = 1
ASSIGNMENT_FIELDS = ("node_id", "local_id", "identity", "public_id")

IdentityKey = tuple[str, str, str]


@dataclass(frozen=True)
class Assignment:
    node_id: str
    local_id: str
    identity: str
    public_id: str

    @property
    def key(self) -> IdentityKey:
        return (self.node_id, self.local_id, self.identity)


@dataclass(frozen=True)
class MergedView:
    # Every input record (shallow-copied) with public ids set, sorted by (public_id,
    # "node_id:local_id").
    records: list[dict[str, Any]]
    by_public_id: dict[str, list[dict[str, Any]]]
    by_public_image_id: dict[str, list[dict[str, Any]]]
    # The full table to persist and pass back as `previous` next time.
    assignments: dict[IdentityKey, Assignment]


@dataclass
class _Group:
    local_id: str
    identity: str
    rank: tuple[int, str]
    # (node_id, record) pairs.
    members: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    public_id: str | None = None

    def identity_keys(self) -> list[IdentityKey]:
        # A key is (node, base id, identity) and the group fixes the last two.
        return [(node_id, self.local_id, self.identity) for node_id in self.nodes]


def identity_of(record: Mapping[str, Any]) -> str:
    """``model_hash:config_hash``, or a per-(node, config) identity when both are empty."""
    return _identity(
        _text(record.get("model_hash")),
        _text(record.get("config_hash")),
        _text(record.get("node_id")),
        _text(record.get("local_id")),
    )


def _identity(model_hash: str, config_hash: str, node_id: str, local_id: str) -> str:
    if model_hash == "" and config_hash == "":
        return f"{UNKNOWN_IDENTITY_PREFIX}{node_id}:{local_id}"
    return f"{model_hash}:{config_hash}"


def public_image_id_for(*, image_id: str, local_id: str, public_id: str) -> str:
    prefix = local_id + "-"
    if image_id.startswith(prefix):
        return f"{public_id}-{image_id[len(prefix) :]}"
    if public_id == local_id:
        return image_id
    return f"{public_id}-{image_id}"


def merge(
    local: Sequence[Mapping[str, Any]],
    remote: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    previous: Mapping[IdentityKey, Assignment],
) -> MergedView:
    """Merge local and remote records into one view; see the module docstring for the rules."""
    groups = _collect_groups(local, remote)
    base_ids = {group.local_id for group in groups.values()}
    previous_by_key = {(a.node_id, a.local_id, a.identity): a for a in previous.values()}
    live_keys = {key for group in groups.values() for key in group.identity_keys()}
    dormant = [a for key, a in previous_by_key.items() if key not in live_keys]

    _assign_public_ids(groups, base_ids, previous_by_key, dormant)

    # Public ids are unique per group, so sorting groups by public id and each group's
    # records by "node_id:local_id" gives the view order without sorting every record.
    records: list[dict[str, Any]] = []
    by_public_id: dict[str, list[dict[str, Any]]] = {}
    by_public_image_id: dict[str, list[dict[str, Any]]] = {}
    for group in sorted(groups.values(), key=_public_id_of):
        public_id = _public_id_of(group)
        local_id = group.local_id
        replicas = _replica_order(group.members)
        for record in replicas:
            record["public_id"] = public_id
            image_id = record.get("image_id")
            if isinstance(image_id, str) and image_id != "":
                # Under the bare id every rule leaves the image id as it is.
                public_image_id = (
                    image_id
                    if public_id == local_id
                    else public_image_id_for(
                        image_id=image_id, local_id=local_id, public_id=public_id
                    )
                )
                record["public_image_id"] = public_image_id
                by_public_image_id.setdefault(public_image_id, []).append(record)
            elif "public_image_id" in record:
                del record["public_image_id"]
        by_public_id[public_id] = replicas
        records.extend(replicas)

    return MergedView(
        records=records,
        by_public_id=by_public_id,
        by_public_image_id=by_public_image_id,
        assignments=_next_table(groups, base_ids, previous_by_key, dormant),
    )


def forget_node(
    assignments: Mapping[IdentityKey, Assignment], *, node_id: str
) -> dict[IdentityKey, Assignment]:
    """The table without a node's entries, for when a node is removed from the cluster for good.

    Until then its suffixes stay reserved so that it finds them again when it comes back.
    """
    return {key: a for key, a in assignments.items() if a.node_id != node_id}


def serialize_assignments(assignments: Mapping[IdentityKey, Assignment]) -> list[dict[str, str]]:
    """JSON-able rows, sorted by key so that an unchanged table serializes to identical bytes."""
    ordered = sorted(assignments.values(), key=lambda a: a.key)
    return [
        {
            "node_id": a.node_id,
            "local_id": a.local_id,
            "identity": a.identity,
            "public_id": a.public_id,
        }
        for a in ordered
    ]


def deserialize_assignments(rows: Iterable[Mapping[str, Any]]) -> dict[IdentityKey, Assignment]:
    """Inverse of ``serialize_assignments``; raises ValueError on a malformed or duplicate row."""
    table: dict[IdentityKey, Assignment] = {}
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"assignment row {index}: expected an object")
        values: list[str] = []
        for name in ASSIGNMENT_FIELDS:
            value = row.get(name)
            if not isinstance(value, str):
                raise ValueError(f"assignment row {index}: {name} must be a string")
            values.append(value)
        assignment = Assignment(*values)
        if assignment.key in table:
            raise ValueError(f"assignment row {index}: duplicate key {assignment.key!r}")
        table[assignment.key] = assignment
    return table


def _text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _collect_groups(
    local: Sequence[Mapping[str, Any]],
    remote: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[tuple[str, str], _Group]:
    # Hot path (every registry rebuild, thousands of records): kept as one flat loop.
    batches: list[tuple[int, str | None, Sequence[Mapping[str, Any]]]] = [
        (ORIGIN_RANK_LOCAL, None, local)
    ]
    batches.extend((ORIGIN_RANK_REMOTE, node_id, remote[node_id]) for node_id in sorted(remote))
    groups: dict[tuple[str, str], _Group] = {}
    for origin_rank, sender, sources in batches:
        for source in sources:
            record = dict(source)
            if sender is None:
                node_id = _text(record.get("node_id"))
            else:
                node_id = sender
                if record.get("node_id") != sender:
                    record["node_id"] = sender
            local_id = record.get("local_id")
            if local_id.__class__ is not str or local_id == "":
                raise ValueError(f"model record from node {node_id!r} has no local_id")
            model_hash = record.get("model_hash")
            config_hash = record.get("config_hash")
            # identity_of(), inlined: a call per record is a tenth of this loop.
            if model_hash.__class__ is not str:
                model_hash = _text(model_hash)
            if config_hash.__class__ is not str:
                config_hash = _text(config_hash)
            if model_hash or config_hash:
                identity = f"{model_hash}:{config_hash}"
            else:
                identity = f"{UNKNOWN_IDENTITY_PREFIX}{node_id}:{local_id}"
            group = groups.get((local_id, identity))
            if group is None:
                group = _Group(local_id=local_id, identity=identity, rank=(origin_rank, node_id))
                groups[(local_id, identity)] = group
            elif sender is None and (origin_rank, node_id) < group.rank:
                # Remote batches come after the local one in node order, so a group's first
                # record already has its best rank unless local records name several nodes.
                group.rank = (origin_rank, node_id)
            group.members.append((node_id, record))
            group.nodes.add(node_id)
    return groups


def _suffix_number(public_id: str, base_id: str) -> int | None:
    """BARE_ID_ORDER for the bare id, N for ``base-N`` (N >= 2, canonical), else None."""
    if public_id == base_id:
        return BARE_ID_ORDER
    prefix = base_id + "-"
    if not public_id.startswith(prefix):
        return None
    digits = public_id[len(prefix) :]
    if not (digits.isascii() and digits.isdigit()) or digits.startswith("0"):
        return None
    number = int(digits)
    return number if number >= FIRST_SUFFIX_NUMBER else None


class _IdAllocator:
    """Public IDs handed out in one rebuild, and the dormant IDs that are still reserved."""

    def __init__(self, base_ids: set[str], dormant: Sequence[Assignment]) -> None:
        self.base_ids = base_ids
        self.taken: set[str] = set()
        self.by_identity: dict[tuple[str, str], list[str]] = {}
        self.by_node_config: dict[tuple[str, str], list[str]] = {}
        # Every dormant id, with the nodes whose dormant entries hold it.
        self.holders: dict[str, set[str]] = {}
        for a in dormant:
            self.by_identity.setdefault((a.local_id, a.identity), []).append(a.public_id)
            self.by_node_config.setdefault((a.node_id, a.local_id), []).append(a.public_id)
            self.holders.setdefault(a.public_id, set()).add(a.node_id)

    def offer(self, group: _Group, candidates: Iterable[str]) -> bool:
        """Give the group the best free candidate (bare ID first, then the lowest suffix)."""
        base_id = group.local_id
        ordered: list[tuple[int, str]] = []
        for candidate in set(candidates):
            number = _suffix_number(candidate, base_id)
            if number is None or candidate in self.taken:
                continue
            if number != BARE_ID_ORDER and candidate in self.base_ids:
                continue
            ordered.append((number, candidate))
        if not ordered:
            return False
        group.public_id = min(ordered)[1]
        self.taken.add(group.public_id)
        return True

    def dormant_of_nodes(self, group: _Group, base_id: str) -> Iterator[str]:
        for node_id in group.nodes:
            for public_id in self.by_node_config.get((node_id, base_id), ()):
                # Held by an absent node too: that model still exists, just offline.
                if self.holders[public_id] <= group.nodes:
                    yield public_id

    def fresh(self, pending: Sequence[_Group], base_id: str) -> None:
        """The bare ID if free, else the smallest suffix nobody holds, dormant or not.

        A dormant id of the group's own identity was offered already, so every dormant
        suffixed id is skipped here. Since `taken` only grows, the smallest free number never
        goes down and one cursor per base suffices.
        """
        next_number = FIRST_SUFFIX_NUMBER
        for group in pending:
            if base_id not in self.taken:
                group.public_id = base_id
            else:
                while True:
                    candidate = f"{base_id}-{next_number}"
                    if (
                        candidate not in self.taken
                        and candidate not in self.base_ids
                        and candidate not in self.holders
                    ):
                        break
                    next_number += 1
                group.public_id = candidate
            self.taken.add(group.public_id)


def _assign_public_ids(
    groups: Mapping[tuple[str, str], _Group],
    base_ids: set[str],
    previous_by_key: Mapping[IdentityKey, Assignment],
    dormant: Sequence[Assignment],
) -> None:
    ids = _IdAllocator(base_ids, dormant)
    by_base: dict[str, list[_Group]] = {}
    for group in groups.values():
        by_base.setdefault(group.local_id, []).append(group)

    for base_id, base_groups in by_base.items():
        base_groups.sort(key=lambda g: (g.rank, g.identity))
        # Rounds, most binding first: the group's own previous ids, dormant ids of its
        # identity, dormant ids its nodes held for this config, then a fresh id.
        pending = [
            g
            for g in base_groups
            if not ids.offer(
                g, (previous_by_key[k].public_id for k in g.identity_keys() if k in previous_by_key)
            )
        ]
        pending = [
            g for g in pending if not ids.offer(g, ids.by_identity.get((base_id, g.identity), ()))
        ]
        pending = [g for g in pending if not ids.offer(g, ids.dormant_of_nodes(g, base_id))]
        ids.fresh(pending, base_id)


def _next_table(
    groups: Mapping[tuple[str, str], _Group],
    base_ids: set[str],
    previous_by_key: Mapping[IdentityKey, Assignment],
    dormant: Sequence[Assignment],
) -> dict[IdentityKey, Assignment]:
    table: dict[IdentityKey, Assignment] = {}
    taken: set[str] = set()
    for group in groups.values():
        public_id = group.public_id
        assert public_id is not None
        taken.add(public_id)
        for key in group.identity_keys():
            # Reusing the unchanged entry skips a frozen-dataclass construction, which is
            # most of this function's cost on a rebuild where nothing moved.
            kept = previous_by_key.get(key)
            if kept is not None and kept.public_id == public_id:
                table[key] = kept
            else:
                table[key] = Assignment(key[0], key[1], key[2], public_id)
    for a in dormant:
        same_model = groups.get((a.local_id, a.identity))
        if same_model is not None:
            assert same_model.public_id is not None
            table[a.key] = Assignment(a.node_id, a.local_id, a.identity, same_model.public_id)
            continue
        number = _suffix_number(a.public_id, a.local_id)
        if number is None or a.public_id in taken:
            continue
        if number != BARE_ID_ORDER and a.public_id in base_ids:
            continue
        table[a.key] = a
    return table


def _public_id_of(group: _Group) -> str:
    assert group.public_id is not None  # every group leaves round 4 with an id
    return group.public_id


def _replica_order(members: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A group's records by "node_id:local_id" (the local id is the same for all of them)."""
    members.sort(key=lambda member: member[0] + ":")
    ordered = [record for _, record in members]
    # Equal keys only come from alias records of one config; order those by content so that
    # the view does not depend on the order a node listed them in.
    start = 0
    while start < len(members):
        end = start + 1
        while end < len(members) and members[end][0] == members[start][0]:
            end += 1
        if end - start > 1:
            ordered[start:end] = sorted(ordered[start:end], key=_content_key)
        start = end
    return ordered


def _content_key(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, default=str)
