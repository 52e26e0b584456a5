"""The router queue of a lane: a pure, clock-injected state machine.

A node whose model is enrolled in lending (owner or helper of any link), or every model with
`auth.fair_share` on, sends its requests through one `LaneQueue` per lane (text, image). At most
`depth` entries of the lane are admitted to the backend at once; the rest wait here, where the
owner may lend some to a helper. The router process wraps this machine and resolves the futures
of the entries reported admitted. No I/O, no asyncio; every entry carries an opaque `payload`
for the caller; time comes only from the injected clock (seconds, float).

Queue order: entries that came back from a helper first (by first arrival), then native entries in
arrival order (with fair share: by key, lending/fairshare.py), then borrowed entries (a helper's
own work always goes ahead of borrowed work).

An entry is HELD only while the hold keeps it waiting: each admission pass re-asks the hold for
the head of a model whose pipe has a free slot, and a HELD entry the pass did not keep (released,
or no slot was free) is QUEUED again. `held_since` keeps the first time it was held. A request
held for a faster helper blocks only its own model's pipe, not the other models of the lane.
Hot path: one deque per (model, pinned/lendable) with lazy deletion: enqueue, admit, complete and
cancel are amortised O(models of the lane), O(1) for the usual handful of models.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from lending.fairshare import FairShare

# Work tuple length per lane: text is (prompt_tokens_estimate, output_tokens), image is (units,).
# A lane not listed learns its arity from the first sized entry of each model.
LANE_WORK_ARITY: dict[str, int] = {"text": 2, "image": 1}

# Lazy deletion leaves dead references in the deques; they are rebuilt once the dead outnumber the
# live by this slack, so memory stays proportional to live entries and rebuilds stay amortised O(1).
COMPACT_SLACK_ENTRIES = 64

MS_PER_SEC = 1000.0


# The agreed API is a str-valued Enum; StrEnum would also change str(State.X).
class State(str, Enum):  # noqa: UP042
    QUEUED = "queued"
    HELD = "held"
    ADMITTED = "admitted"
    LENT = "lent"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Entry:
    model_id: str
    arrived_at: float
    work: tuple[float, ...] = ()
    # The part of `work` the owner's own backend skips (a prompt prefix it holds in cache):
    # the owner's price leaves it out, a helper's does not (it holds no cache for it).
    cached: tuple[float, ...] = ()
    context: int = 0
    pinned: bool = False
    borrowed: bool = False
    returned: bool = False
    payload: Any = None
    state: State = State.QUEUED
    seq: int = 0
    admitted_at: float | None = None
    lent_at: float | None = None
    helper: tuple[str, str] | None = None
    borrowed_ahead: int = 0
    held_since: float | None = None
    request_id: str | None = None
    # Fair share (lending/fairshare.py): key ("" = none), weight, work, `parallel` (0: depth).
    tenant: str = ""
    weight: float = 1.0
    cost: float = 1.0
    depth: int = 0


HoldPredicate = Callable[[Entry, "LaneQueue", float], bool]
HeldCallback = Callable[[Entry, float], None]


@dataclass(frozen=True)
class QueueStats:
    pending_count: int
    pending_work: tuple[float, ...]
    pending_context: int
    backlog_count: int
    backlog_work: tuple[float, ...]
    lent_count: int
    # Waiting entries that may be lent: neither streams nor requests that came back.
    lendable_count: int = 0
    # Of backlog_work, what the owner's prompt cache covers (Entry.cached); () when none.
    backlog_cached: tuple[float, ...] = ()


def _waiting(entry: Entry) -> bool:
    return entry.state is State.QUEUED or entry.state is State.HELD


def _waiting_native(entry: Entry) -> bool:
    # A returned entry lives in the returned heap; a reference left in a native deque is dead.
    return (entry.state is State.QUEUED or entry.state is State.HELD) and not entry.returned


def _live_head(dq: deque[Entry]) -> Entry | None:
    while dq:
        head = dq[0]
        if _waiting_native(head):
            return head
        dq.popleft()
    return None


def _sum_or_none(pending: list[float], admitted: list[float]) -> tuple[float, ...]:
    # Most queues hold nothing cached: they report (), as an owner that never counted it.
    if not any(pending) and not any(admitted):
        return ()
    return tuple(p + a for p, a in zip(pending, admitted, strict=True))


def _too_sparse(stored: int, live: int) -> bool:
    return stored > 2 * live + COMPACT_SLACK_ENTRIES


def _add_into(acc: list[float], work: tuple[float, ...], sign: float) -> None:
    if len(work) == 2:
        # The text lane's shape, on every admission: skip the generic loop.
        acc[0] += sign * work[0]
        acc[1] += sign * work[1]
        return
    for index, value in enumerate(work):
        acc[index] += sign * value


class _ModelQueue:
    """Native entries of one model waiting in arrival order, plus that model's counters."""

    __slots__ = (
        "admitted_cached",
        "admitted_native",
        "admitted_sized",
        "admitted_work",
        "arity",
        "lendable",
        "lendable_live",
        "lent_count",
        "model_id",
        "pending_context",
        "pending_count",
        "pinned",
        "pinned_live",
        "sized_cached",
        "sized_context",
        "sized_count",
        "sized_work",
    )

    def __init__(self, model_id: str, arity: int | None) -> None:
        self.model_id = model_id
        self.arity = arity
        # Pinned entries have their own deque so lending never walks over streams.
        self.lendable: deque[Entry] = deque()
        self.pinned: deque[Entry] = deque()
        self.lendable_live = 0
        self.pinned_live = 0
        # Counters cover returned entries too (they are this model's pending work).
        self.pending_count = 0
        self.pending_context = 0
        self.sized_count = 0
        self.sized_context = 0
        self.sized_work: list[float] = [0.0] * (arity or 0)
        self.admitted_native = 0
        self.admitted_sized = 0
        self.admitted_work: list[float] = [0.0] * (arity or 0)
        # Cached parts (Entry.cached) of the sized sums above.
        self.sized_cached: list[float] = [0.0] * (arity or 0)
        self.admitted_cached: list[float] = [0.0] * (arity or 0)
        self.lent_count = 0

    def learn(self, entry: Entry) -> None:
        if self.arity is None and entry.work:
            self.arity = len(entry.work)
            self.sized_work = [0.0] * self.arity
            self.admitted_work = [0.0] * self.arity
            self.sized_cached = [0.0] * self.arity
            self.admitted_cached = [0.0] * self.arity

    def is_sized(self, entry: Entry) -> bool:
        return self.arity is not None and len(entry.work) == self.arity

    def waiting_natives(self) -> int:
        return self.lendable_live + self.pinned_live

    def push(self, entry: Entry) -> None:
        if entry.pinned:
            self.pinned.append(entry)
            self.pinned_live += 1
        else:
            self.lendable.append(entry)
            self.lendable_live += 1

    def head(self, *, pinned_first: bool = False) -> Entry | None:
        # With no live entry a deque holds only dead references: drop them without a scan.
        if self.lendable_live:
            lendable = _live_head(self.lendable)
        else:
            lendable = None
            if self.lendable:
                self.lendable.clear()
        if self.pinned_live:
            pinned = _live_head(self.pinned)
        else:
            pinned = None
            if self.pinned:
                self.pinned.clear()
        if lendable is None:
            return pinned
        if pinned is None or (lendable.seq < pinned.seq and not pinned_first):
            return lendable
        return pinned

    def pop_head(self, entry: Entry) -> None:
        # `entry` was just returned by head(), so it is the left end of its deque.
        if entry.pinned:
            self.pinned.popleft()
            self.pinned_live -= 1
        else:
            self.lendable.popleft()
            self.lendable_live -= 1

    def forget(self, entry: Entry) -> None:
        """`entry` left its deque from the middle; its state already says it is not waiting."""
        if entry.pinned:
            self.pinned_live -= 1
            if _too_sparse(len(self.pinned), self.pinned_live):
                self.pinned = deque(e for e in self.pinned if _waiting_native(e))
        else:
            self.lendable_live -= 1
            if _too_sparse(len(self.lendable), self.lendable_live):
                self.lendable = deque(e for e in self.lendable if _waiting_native(e))

    def add_pending(self, entry: Entry) -> None:
        self.pending_count += 1
        self.pending_context += entry.context
        if self.is_sized(entry):
            self.sized_count += 1
            self.sized_context += entry.context
            _add_into(self.sized_work, entry.work, 1.0)
            if entry.cached:
                _add_into(self.sized_cached, entry.cached, 1.0)

    def remove_pending(self, entry: Entry) -> None:
        self.pending_count -= 1
        self.pending_context -= entry.context
        if self.is_sized(entry):
            self.sized_count -= 1
            self.sized_context -= entry.context
            _add_into(self.sized_work, entry.work, -1.0)
            if entry.cached:
                _add_into(self.sized_cached, entry.cached, -1.0)
            if self.sized_count == 0:
                # Float sums drift under add/subtract; an empty set is exactly zero.
                self.sized_work = [0.0] * len(self.sized_work)
                self.sized_cached = [0.0] * len(self.sized_cached)

    def add_admitted(self, entry: Entry) -> None:
        self.admitted_native += 1
        if self.is_sized(entry):
            self.admitted_sized += 1
            _add_into(self.admitted_work, entry.work, 1.0)
            if entry.cached:
                _add_into(self.admitted_cached, entry.cached, 1.0)

    def remove_admitted(self, entry: Entry) -> None:
        self.admitted_native -= 1
        if self.is_sized(entry):
            self.admitted_sized -= 1
            _add_into(self.admitted_work, entry.work, -1.0)
            if entry.cached:
                _add_into(self.admitted_cached, entry.cached, -1.0)
            if self.admitted_sized == 0:
                self.admitted_work = [0.0] * len(self.admitted_work)
                self.admitted_cached = [0.0] * len(self.admitted_cached)

    def natives_in_order(self) -> Iterable[Entry]:
        return heapq.merge(
            (e for e in self.lendable if _waiting_native(e)),
            (e for e in self.pinned if _waiting_native(e)),
            key=_seq_of,
        )


def _seq_of(entry: Entry) -> int:
    return entry.seq


class LaneQueue:
    """The router queue of one lane of one node.

    Every mutating method returns the entries admitted as a result (except `withdraw` and
    `return_pending_borrowed`, which return the entries they took out). The hold predicate and the
    `on_held` callback are called during admission and must not mutate the queue.
    """

    def __init__(
        self,
        lane: str,
        *,
        depth: int,
        clock: Callable[[], float],
        hold: HoldPredicate | None = None,
        on_held: HeldCallback | None = None,
        unlendable_first: Callable[[str], bool] | None = None,
        borrowed_depth: int | None = None,
        fair: bool = False,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        if borrowed_depth is not None and borrowed_depth < 1:
            raise ValueError(f"borrowed_depth must be at least 1, got {borrowed_depth}")
        self.lane = lane
        self.depth = depth
        # Borrowed entries admitted to the backend at once (None: up to `depth`). The rest
        # wait here, where the helper's own work can still take them back.
        self.borrowed_depth = borrowed_depth
        # Models for which streams go to the backend before lendable entries (a live lease:
        # the owner runs what only it can run, and keeps the lendable work for the helper).
        self._unlendable_first = unlendable_first
        self._clock = clock
        self._hold = hold
        # Called once per entry, the first time it is held (for the held_for_helper row).
        self._on_held = on_held
        self._models: dict[str, _ModelQueue] = {}
        # Models with at least one native entry waiting in their deques; admission scans only these.
        self._waiting_models: dict[str, _ModelQueue] = {}
        # Returned entries: (arrived_at, seq, entry); seq is unique so entries are never compared.
        self._returned: list[tuple[float, int, Entry]] = []
        self._returned_live = 0
        self._borrowed: deque[Entry] = deque()
        self._borrowed_live = 0
        self._native_pending = 0
        self._admitted: dict[Entry, None] = {}
        self._borrowed_admitted = 0
        self._lent: dict[Entry, None] = {}
        # model_id -> the entry the hold kept waiting at the last admission pass.
        self._held: dict[str, Entry] = {}
        self._seq = 0
        # Fair share: natives and borrowed entries go by key, each up to its own depth.
        self._fair = FairShare[Entry](_waiting_native) if fair else None
        self._fair_borrowed = FairShare[Entry](_waiting) if fair else None

    # ----- mutations -------------------------------------------------------------------------

    def enqueue(self, entry: Entry) -> list[Entry]:
        if entry.seq or entry.state is not State.QUEUED:
            raise ValueError("entry was already queued")
        self._seq += 1
        entry.seq = self._seq
        if entry.borrowed:
            self._borrowed.append(entry)
            self._borrowed_live += 1
            if self._fair_borrowed is not None:
                self._fair_borrowed.push(entry)
        else:
            entry.borrowed_ahead = self._borrowed_admitted
            model = self._model(entry.model_id)
            model.learn(entry)
            self._add_waiting_native(entry, model)
        return self._admit()

    def complete(self, entry: Entry) -> list[Entry]:
        """An admitted entry finished. Completing an entry already DONE (cancelled) is a no-op."""
        if entry.state is State.DONE:
            return []
        if entry.state is not State.ADMITTED:
            raise ValueError(f"cannot complete an entry that is {entry.state.value}")
        self._release_admitted(entry)
        entry.state = State.DONE
        return self._admit()

    def cancel(self, entry: Entry) -> list[Entry]:
        """The client went away. A LENT entry is dropped: the caller cancels its forward."""
        state = entry.state
        if state is State.DONE:
            return []
        if state is State.ADMITTED:
            self._release_admitted(entry)
            entry.state = State.DONE
        elif state is State.LENT:
            self._release_lent(entry)
            entry.state = State.DONE
        else:
            self._take_waiting(entry, State.DONE)
        return self._admit()

    def set_depth(self, depth: int) -> list[Entry]:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        return self._admit()

    def set_hold(self, hold: HoldPredicate | None) -> list[Entry]:
        self._hold = hold
        return self._admit()

    def reevaluate(self) -> list[Entry]:
        return self._admit()

    def withdraw(
        self,
        model_id: str,
        count: int,
        *,
        fits: Callable[[Entry], bool] | None = None,
        helper: tuple[str, str] | None = None,
        size: Callable[[Entry], float] | None = None,
    ) -> list[Entry]:
        """Take up to `count` waiting entries of the model for lending, newest first.

        An entry the hold keeps for a faster helper goes first: it was kept for exactly this.
        With `size`, the largest entries go next (newest first among equals): a helper that
        takes the long jobs leaves the owner the short ones, which is what evens out the two
        finish times; taking `size` costs a scan of the model's waiting entries.
        Never pinned, borrowed or returned entries, and only those `fits` accepts. They become
        LENT (lent_at = now, helper = `helper`). Admission does not run here: when a HELD entry
        was taken, its model's next entry may now deserve a free slot, so call `reevaluate()`
        afterwards.
        """
        model = self._models.get(model_id)
        if model is None or count <= 0:
            return []
        lendable = model.lendable
        while lendable and not _waiting_native(lendable[-1]):
            lendable.pop()
        held = self._held.get(model_id)
        if held is not None and (held.state is not State.HELD or (fits and not fits(held))):
            held = None
        taken = [held] if held is not None else []

        def takeable(entry: Entry) -> bool:
            return _waiting_native(entry) and entry is not held and (fits is None or fits(entry))

        wanted = count - len(taken)
        if wanted > 0 and size is not None:
            candidates = [e for e in lendable if takeable(e)]
            taken.extend(heapq.nlargest(wanted, candidates, key=lambda e: (size(e), e.seq)))
        elif wanted > 0:
            taken.extend(itertools.islice((e for e in reversed(lendable) if takeable(e)), wanted))
        if not taken:
            return []
        now = self._clock()
        for entry in taken:
            self._take_waiting(entry, State.LENT)
            entry.lent_at = now
            entry.helper = helper
            model.lent_count += 1
            self._lent[entry] = None
        return taken

    def lent_finished(self, entry: Entry, *, admit: bool = True) -> list[Entry]:
        """The helper answered a lent entry. A no-op if it was cancelled meanwhile.

        With ``admit=False`` admission does not run: the caller first lends into the freed
        slot, then calls `reevaluate()`.
        """
        if entry.state is State.DONE:
            return []
        if entry.state is not State.LENT:
            raise ValueError(f"cannot finish a lent entry that is {entry.state.value}")
        self._release_lent(entry)
        entry.state = State.DONE
        return self._admit() if admit else []

    def lent_returned(self, entry: Entry) -> list[Entry]:
        """The helper handed a lent entry back: it goes to the head, keeping its first arrival."""
        if entry.state is State.DONE:
            return []
        if entry.state is not State.LENT:
            raise ValueError(f"cannot return an entry that is {entry.state.value}")
        self._release_lent(entry)
        entry.state = State.QUEUED
        entry.returned = True
        entry.lent_at = None
        entry.helper = None
        self._add_waiting_native(entry, self._model(entry.model_id))
        return self._admit()

    def return_pending_borrowed(self) -> list[Entry]:
        """A native request arrived at a helper: every borrowed entry not yet admitted leaves."""
        handed_back = [e for e in self._borrowed if _waiting(e)]
        for entry in handed_back:
            entry.state = State.DONE
        self._borrowed.clear()
        self._borrowed_live = 0
        if self._fair_borrowed is not None:
            self._fair_borrowed.clear()
        return handed_back

    # ----- queries ---------------------------------------------------------------------------

    def stats(self, model_id: str) -> QueueStats:
        model = self._models.get(model_id)
        if model is None:
            zero = (0.0,) * LANE_WORK_ARITY.get(self.lane, 0)
            return QueueStats(0, zero, 0, 0, zero, 0, 0)
        pending_work = tuple(model.sized_work)
        backlog_work = tuple(
            p + a for p, a in zip(model.sized_work, model.admitted_work, strict=True)
        )
        return QueueStats(
            pending_count=model.pending_count,
            pending_work=pending_work,
            pending_context=model.pending_context,
            backlog_count=model.pending_count + model.admitted_native,
            backlog_work=backlog_work,
            lent_count=model.lent_count,
            lendable_count=model.lendable_live,
            backlog_cached=_sum_or_none(model.sized_cached, model.admitted_cached),
        )

    def sized_pending(self, model_id: str) -> tuple[int, tuple[float, ...], int]:
        """(count, work, context) over waiting native entries whose work has the model's arity.

        Means computed from it are not diluted by entries that have no size estimate.
        """
        model = self._models.get(model_id)
        if model is None:
            return 0, (0.0,) * LANE_WORK_ARITY.get(self.lane, 0), 0
        return model.sized_count, tuple(model.sized_work), model.sized_context

    def sized_cached(self, model_id: str) -> tuple[float, ...]:
        """Of sized_pending's work, the part the owner's prompt cache covers (Entry.cached)."""
        model = self._models.get(model_id)
        if model is None:
            return (0.0,) * LANE_WORK_ARITY.get(self.lane, 0)
        return tuple(model.sized_cached)

    def admitted(self, model_id: str | None = None) -> list[Entry]:
        """Admitted entries (borrowed ones included) in admission order."""
        if model_id is None:
            return list(self._admitted)
        return [e for e in self._admitted if e.model_id == model_id]

    def pending(self, model_id: str | None = None) -> list[Entry]:
        """QUEUED and HELD entries (borrowed ones included) in queue order."""
        returned = [
            e
            for _, _, e in sorted(self._returned)
            if _waiting(e) and (model_id is None or e.model_id == model_id)
        ]
        if model_id is None:
            natives: Iterable[Entry] = heapq.merge(
                *(m.natives_in_order() for m in self._waiting_models.values()), key=_seq_of
            )
        else:
            model = self._models.get(model_id)
            natives = model.natives_in_order() if model is not None else ()
        borrowed = [
            e
            for e in self._borrowed
            if _waiting(e) and (model_id is None or e.model_id == model_id)
        ]
        return [*returned, *natives, *borrowed]

    def lent(self, model_id: str | None = None) -> list[Entry]:
        """LENT entries in the order they were lent."""
        if model_id is None:
            return list(self._lent)
        return [e for e in self._lent if e.model_id == model_id]

    def lent_to(self, model_id: str, helper: tuple[str, str]) -> list[Entry]:
        """The model's LENT entries out with one helper (node, model), in the order lent."""
        return [e for e in self._lent if e.model_id == model_id and e.helper == helper]

    def own_work(self) -> bool:
        return self._native_pending > 0 or len(self._admitted) > self._borrowed_admitted

    def borrowed_admitted(self) -> int:
        return self._borrowed_admitted

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Rows for the Nodes page: every QUEUED, HELD and LENT entry (admitted ones are not)."""
        rows: list[dict[str, Any]] = []
        for entry in [*self.pending(), *self._lent]:
            row: dict[str, Any] = {
                "lane": self.lane,
                "model_id": entry.model_id,
                "state": entry.state.value,
                "waiting_ms": max(0, round((now - entry.arrived_at) * MS_PER_SEC)),
                "arrived_at": entry.arrived_at,
                "pinned": entry.pinned,
                "returned": entry.returned,
                "key": entry.tenant or None,
            }
            if entry.state is State.LENT and entry.helper is not None:
                row["helper_node_id"], row["helper_model_id"] = entry.helper
            rows.append(row)
        return rows

    def __len__(self) -> int:
        return self._native_pending + self._borrowed_live + len(self._admitted) + len(self._lent)

    # ----- internals -------------------------------------------------------------------------

    def _model(self, model_id: str) -> _ModelQueue:
        model = self._models.get(model_id)
        if model is None:
            model = _ModelQueue(model_id, LANE_WORK_ARITY.get(self.lane))
            self._models[model_id] = model
        return model

    def _add_waiting_native(self, entry: Entry, model: _ModelQueue) -> None:
        model.add_pending(entry)
        self._native_pending += 1
        if entry.returned:
            heapq.heappush(self._returned, (entry.arrived_at, entry.seq, entry))
            self._returned_live += 1
        else:
            model.push(entry)
            self._waiting_models[entry.model_id] = model
            if self._fair is not None:
                self._fair.push(entry)

    def _take_waiting(self, entry: Entry, new_state: State) -> None:
        """Remove a QUEUED/HELD entry from the middle of its structure (lazily)."""
        if not _waiting(entry):
            raise ValueError(f"entry is {entry.state.value}, not waiting")
        # The state change is what marks the deque reference dead, so it comes first.
        entry.state = new_state
        if entry.borrowed:
            if self._fair_borrowed is not None:
                self._fair_borrowed.forget(entry)
            self._forget_borrowed()
            return
        model = self._models[entry.model_id]
        model.remove_pending(entry)
        self._native_pending -= 1
        if self._held.get(entry.model_id) is entry:
            del self._held[entry.model_id]
        if entry.returned:
            self._returned_live -= 1
            if _too_sparse(len(self._returned), self._returned_live):
                self._returned = [item for item in self._returned if _waiting(item[2])]
                heapq.heapify(self._returned)
        else:
            model.forget(entry)
            if self._fair is not None:
                self._fair.forget(entry)
            if model.waiting_natives() == 0:
                self._waiting_models.pop(entry.model_id, None)

    def _forget_borrowed(self) -> None:
        self._borrowed_live -= 1
        if _too_sparse(len(self._borrowed), self._borrowed_live):
            self._borrowed = deque(e for e in self._borrowed if _waiting(e))

    def _release_admitted(self, entry: Entry) -> None:
        del self._admitted[entry]
        if entry.borrowed:
            self._borrowed_admitted -= 1
        else:
            self._models[entry.model_id].remove_admitted(entry)

    def _release_lent(self, entry: Entry) -> None:
        del self._lent[entry]
        self._models[entry.model_id].lent_count -= 1

    def _borrowed_room(self) -> bool:
        cap = self.borrowed_depth
        return cap is None or self._borrowed_admitted < cap

    def _returned_head(self) -> Entry | None:
        heap = self._returned
        while heap:
            entry = heap[0][2]
            if _waiting(entry):
                return entry
            heapq.heappop(heap)
        return None

    def _borrowed_head(self) -> Entry | None:
        if self._fair_borrowed is not None:
            return self._fair_borrowed.head()
        dq = self._borrowed
        while dq:
            entry = dq[0]
            if _waiting(entry):
                return entry
            dq.popleft()
        return None

    def _native_head(self, blocked: dict[str, Entry] | None) -> Entry | None:
        if self._fair is not None:
            return self._fair.head(None if not blocked else lambda e: e.model_id in blocked)
        best: Entry | None = None
        first = self._unlendable_first
        for model_id, model in self._waiting_models.items():
            if blocked is not None and model_id in blocked:
                continue
            head = model.head(pinned_first=first is not None and first(model_id))
            if head is not None and (best is None or head.seq < best.seq):
                best = head
        return best

    def _may_hold(self, entry: Entry) -> bool:
        if entry.pinned or entry.returned or entry.borrowed:
            return False
        running = self._models[entry.model_id].admitted_native
        # Only a slot behind this model's own running job may be kept free: never when nothing
        # runs, and never when the pipe is shared with borrowed work or another model.
        return running > 0 and len(self._admitted) == running

    def _admit(self) -> list[Entry]:
        admitted: list[Entry] = []
        now: float | None = None
        # Models whose head the hold keeps this pass; the rest of their entries wait behind it.
        held_now: dict[str, Entry] | None = None
        while self._fair is not None or len(self._admitted) < self.depth:
            entry = self._returned_head()
            if entry is None:
                entry = self._native_head(held_now)
                if self._full(entry):
                    break
                if entry is not None and self._hold is not None and self._may_hold(entry):
                    if now is None:
                        now = self._clock()
                    if self._hold(entry, self, now):
                        self._mark_held(entry, now)
                        held_now = {**(held_now or {}), entry.model_id: entry}
                        continue
                if entry is None and self._native_pending == 0 and self._borrowed_room():
                    entry = self._borrowed_head()
                if entry is None:
                    break
            if self._full(entry):
                break
            if now is None:
                now = self._clock()
            self._admit_entry(entry, now)
            admitted.append(entry)
        if self._held or held_now:
            self._settle_holds(held_now)
        return admitted

    def _full(self, entry: Entry | None) -> bool:
        return entry is not None and len(self._admitted) >= (entry.depth or self.depth)

    def _mark_held(self, entry: Entry, now: float) -> None:
        entry.state = State.HELD
        if entry.held_since is None:
            entry.held_since = now
            if self._on_held is not None:
                self._on_held(entry, now)

    def _settle_holds(self, held_now: dict[str, Entry] | None) -> None:
        # HELD means the hold kept the entry waiting at the last pass; one it did not keep
        # (released, or no slot was free to consider it for) is plainly queued again.
        for model_id, entry in self._held.items():
            kept = held_now is not None and held_now.get(model_id) is entry
            if entry.state is State.HELD and not kept:
                entry.state = State.QUEUED
        self._held = held_now if held_now is not None else {}

    def _admit_entry(self, entry: Entry, now: float) -> None:
        # `entry` is the live head of its structure (just returned by a *_head method).
        fair = self._fair_borrowed if entry.borrowed else self._fair
        if fair is not None and not entry.returned:
            fair.admitted(entry)  # while it still counts as waiting
        was_held = entry.state is State.HELD
        entry.state = State.ADMITTED
        entry.admitted_at = now
        self._admitted[entry] = None
        if entry.borrowed:
            if fair is None:
                self._borrowed.popleft()
                self._borrowed_live -= 1
            else:
                self._forget_borrowed()
            self._borrowed_admitted += 1
            return
        model = self._models[entry.model_id]
        model.remove_pending(entry)
        model.add_admitted(entry)
        self._native_pending -= 1
        if entry.returned:
            heapq.heappop(self._returned)
            self._returned_live -= 1
        else:
            if fair is None:
                model.pop_head(entry)
            else:
                model.forget(entry)  # not always the left end of its deque
            if model.waiting_natives() == 0:
                self._waiting_models.pop(entry.model_id, None)
        if was_held and self._held.get(entry.model_id) is entry:
            del self._held[entry.model_id]
