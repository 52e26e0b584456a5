"""Weighted fair share across keys: start-time fair queuing over the router queue's entries.

With `auth.fair_share` on, the router queue (lending/queue.py) picks the next native request
to admit across *tenants* (a stored key's name; "" for every request without one) instead of
by arrival. Each tenant waits in its own FIFO, so requests of one key keep their order; the
tenants compete by start tags (Goyal, Vin and Cheng's start-time fair queuing):

- a tenant's head request gets the start tag `S = max(V, F)`, where `F` is the finish tag
  of the tenant's last admitted request and `V` the queue's virtual time;
- the head with the smallest start tag goes next (the earlier arrival on a tie); admitting
  it sets `V = S` and the tenant's `F = S + cost / weight`.

`cost` is the entry's estimated work (the caller prices its work vector: milliseconds the
model's fit predicts, lending/flow.py) and `weight` the key's `share`. A tenant with weight
3 thus gets three times the work of a tenant with weight 1 while both wait; a tenant that
sends one request now and then starts at `V` and goes ahead of a flood's next request.
Past use is remembered for one request at most: a tenant's `F` never exceeds `V` by more than
its last request's `cost / weight`, so a key that was alone on the model is not punished later
(start-time fair queuing needs no reset of `V` when the server idles).

Tags are given to a tenant's head only (not on arrival), so a request that leaves the queue
without running (cancelled, lent to a helper) costs its tenant nothing. Pure and clock-free:
the queue calls it; entries are only read (`tenant`, `weight`, `cost`, `seq`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

# Tenant deques and the heap drop dead references lazily; they are rebuilt once the dead
# outnumber the live by this slack (as in lending/queue.py).
COMPACT_SLACK = 64

# Idle tenants are forgotten only past this many (their finish tags are then at or below V,
# so forgetting them changes no start tag).
IDLE_TENANTS_KEPT = 1024


class Fair(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def weight(self) -> float: ...
    @property
    def cost(self) -> float: ...
    @property
    def seq(self) -> int: ...


E = TypeVar("E", bound=Fair)


def clean_weight(value: object) -> float:
    """A usable weight from anything: a positive finite number, else 1."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1.0
    weight = float(value)
    return weight if math.isfinite(weight) and weight > 0 else 1.0


def clean_cost(value: object, fallback: float) -> float:
    """A usable cost: a positive finite number, else `fallback`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fallback
    cost = float(value)
    return cost if math.isfinite(cost) and cost > 0 else fallback


class _Tenant(Generic[E]):
    __slots__ = ("finish", "head_seq", "live", "name", "queue", "start", "token")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: deque[E] = deque()
        self.live = 0
        self.finish = 0.0
        # Its current heap item: the head's start tag and seq, and the token (0: none).
        self.start = 0.0
        self.head_seq = 0
        self.token = 0


class FairShare(Generic[E]):
    """Tenants' FIFOs and the heap of their heads, ordered by start tag.

    `alive(entry)` says whether an entry still waits; the owner of the entries marks them
    dead (state change) before calling `forget`, and `admitted` only for the entry `head`
    just returned.
    """

    def __init__(self, alive: Callable[[E], bool]) -> None:
        self._alive = alive
        self._tenants: dict[str, _Tenant[E]] = {}
        # (start tag, seq of the head, token, tenant); tokens are unique, so the tenant
        # object is never compared, and an item whose token is not its tenant's is stale.
        self._heap: list[tuple[float, int, int, _Tenant[E]]] = []
        self._token = 0
        self._waiting_tenants = 0
        self._live = 0
        self.virtual = 0.0

    # ----- mutations -------------------------------------------------------------------------

    def push(self, entry: E) -> None:
        tenant = self._tenants.get(entry.tenant)
        if tenant is None:
            if len(self._tenants) > IDLE_TENANTS_KEPT + self._waiting_tenants:
                self._forget_idle()
            tenant = self._tenants[entry.tenant] = _Tenant(entry.tenant)
        tenant.queue.append(entry)
        tenant.live += 1
        self._live += 1
        if tenant.live == 1:
            self._waiting_tenants += 1
        if tenant.token == 0:
            self._tag(tenant, entry)

    def admitted(self, entry: E) -> None:
        """`entry`, which `head` just returned, leaves for the backend."""
        tenant = self._tenants[entry.tenant]
        queue = tenant.queue
        # `head` left the live head at the left end; anything else is a caller's mistake.
        if not queue or queue[0] is not entry:
            raise ValueError("only the head of its tenant can be admitted")
        queue.popleft()
        start = tenant.start
        if start > self.virtual:
            self.virtual = start
        cost, weight = entry.cost, entry.weight
        if not (type(cost) is float and 0.0 < cost < math.inf):
            cost = clean_cost(cost, 1.0)  # the caller cleans it; a bad one must not crash
        if not (type(weight) is float and 0.0 < weight < math.inf):
            weight = clean_weight(weight)
        tenant.finish = start + cost / weight
        self._left(tenant)
        nxt = self._live_head(tenant)
        if nxt is None:
            tenant.token = 0
        else:
            self._tag(tenant, nxt)

    def forget(self, entry: E) -> None:
        """`entry` left from anywhere in its tenant's FIFO without running (already dead)."""
        tenant = self._tenants.get(entry.tenant)
        if tenant is None:
            return
        self._left(tenant)
        if len(tenant.queue) > 2 * tenant.live + COMPACT_SLACK:
            tenant.queue = deque(e for e in tenant.queue if self._alive(e))
        if tenant.token and tenant.head_seq == entry.seq:
            # Its head left: the next one is tagged now, as if it had just arrived at the head.
            nxt = self._live_head(tenant)
            if nxt is None:
                tenant.token = 0
            else:
                self._tag(tenant, nxt)

    def clear(self) -> None:
        """Every entry left (the caller marked them dead)."""
        for tenant in self._tenants.values():
            tenant.queue.clear()
            tenant.live = 0
            tenant.token = 0
        self._heap.clear()
        self._waiting_tenants = 0
        self._live = 0

    # ----- queries ---------------------------------------------------------------------------

    def head(self, skip: Callable[[E], bool] | None = None) -> E | None:
        """The waiting entry with the smallest start tag, passing over those `skip` refuses."""
        heap = self._heap
        aside: list[tuple[float, int, int, _Tenant[E]]] = []
        found: E | None = None
        while heap:
            _, seq, token, tenant = heap[0]
            if token != tenant.token:
                heapq.heappop(heap)  # stale
                continue
            entry = self._live_head(tenant)
            if entry is None:
                heapq.heappop(heap)
                tenant.token = 0
                continue
            if entry.seq != seq:
                # Its head left without running: the next one is tagged now.
                heapq.heappop(heap)
                self._tag(tenant, entry)
                continue
            if skip is not None and skip(entry):
                aside.append(heapq.heappop(heap))
                continue
            found = entry
            break
        for item in aside:
            heapq.heappush(heap, item)
        return found

    def waiting(self) -> dict[str, int]:
        """Waiting entries per tenant (tenants with none are left out)."""
        return {name: t.live for name, t in self._tenants.items() if t.live > 0}

    def start_tag(self, name: str) -> float | None:
        """The start tag of the tenant's head, or None when it has nothing waiting."""
        tenant = self._tenants.get(name)
        return tenant.start if tenant is not None and tenant.live > 0 else None

    def finish_tag(self, name: str) -> float:
        tenant = self._tenants.get(name)
        return tenant.finish if tenant is not None else 0.0

    def __len__(self) -> int:
        return self._live

    # ----- internals -------------------------------------------------------------------------

    def _tag(self, tenant: _Tenant[E], head: E) -> None:
        self._token += 1
        tenant.token = self._token
        tenant.start = max(self.virtual, tenant.finish)
        tenant.head_seq = head.seq
        heapq.heappush(self._heap, (tenant.start, head.seq, self._token, tenant))
        if len(self._heap) > 2 * self._waiting_tenants + COMPACT_SLACK:
            self._heap = [item for item in self._heap if item[2] == item[3].token]
            heapq.heapify(self._heap)

    def _live_head(self, tenant: _Tenant[E]) -> E | None:
        queue = tenant.queue
        while queue:
            if self._alive(queue[0]):
                return queue[0]
            queue.popleft()
        return None

    def _left(self, tenant: _Tenant[E]) -> None:
        tenant.live -= 1
        self._live -= 1
        if tenant.live == 0:
            self._waiting_tenants -= 1

    def _forget_idle(self) -> None:
        virtual = self.virtual
        for name in [
            name
            for name, t in self._tenants.items()
            if t.live == 0 and t.token == 0 and t.finish <= virtual
        ]:
            del self._tenants[name]
