"""What-if replay of one owner/helper pair: recorded arrivals through the real planner.

Pure: no Django, no I/O, no wall clock. A discrete-event loop on a simulated clock replays the
owner's recorded arrivals (with their work) and the helper's own requests. Every event that
makes the real owner report to the master (an arrival, a completion, a probe falling due)
asks ``planner.plan_lane`` for a lease, with endpoints built as the master builds them from
runtime status and with the fits the master knew (``known``); the jobs themselves take what
the fits of the whole window say they cost (``truth``). The owner's backend takes at most
``backend_depth`` requests; the rest are held and lent under a live lease, largest first by
the owner's price (newest first among equals), up to the lease's slots; a finished lent job's
slot is refilled at once under a priced lease. The helper serves one request at a time and
its own requests go first: a borrowed request it has not started goes back to the owner,
which runs it.

The hold for a faster helper follows lending/hold.py: a slot behind a running job stays empty
while a priced lease's lent slots are all busy and the helper is predicted to finish the next
request sooner; the request held goes first when a lent slot frees (lending/queue.py). With a
lent slot free, such a request is lent at once. A lease the planner does not renew is kept
while the master would keep it (lending/carry.py: nothing lendable held, the helper accepting)
and dropped otherwise, as the master's answer drops it.
Not modelled: network time between nodes, restores.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from analytics.fitting import CostFit
from lending.carry import kept_leases
from lending.planner import Endpoint, Lease, LinkTarget, Settings, plan_lane
from lending.pricing import CostTable, helper_finish_ms, owner_finish_ms

__all__ = [
    "BurstResult",
    "Pair",
    "ReplaySettings",
    "Request",
    "replay",
]

# The last burst ends this long after its last arrival at the latest: a replay that cannot
# finish (no price for anything) still ends.
NEVER_MS = 1e12


@dataclass(frozen=True, slots=True)
class Request:
    """One recorded arrival: when (ms on the replay's clock) and the work it asked for."""

    at_ms: float
    work: tuple[float, ...]
    burst: int = 0


@dataclass(frozen=True)
class Pair:
    """The owner/helper set replayed, and what the planner knew about them."""

    lane: str
    owner_node: str
    owner_model: str
    owner_config: str
    helper_node: str
    helper_model: str
    helper_config: str
    known: CostTable
    """The fits (and load times) the master planned with."""
    owner_truth: CostFit
    """What one owner job costs (the fit over the whole window)."""
    helper_truth: CostFit | None
    helper_loaded: bool = True
    load_if_unloaded: bool = True
    context_capacity: int = 0
    helper_idle_ms: float = NEVER_MS
    """How long the helper had been without work of its own when the replay starts."""


@dataclass(frozen=True)
class ReplaySettings:
    backend_depth: int
    probe_idle_ms: float
    faster_slots: int
    slower_slots: int
    probe_slots: int
    grant_ttl_ms: int
    hold_for_faster_helper: bool = True
    linked: bool = True
    """False replays the same traffic with the link removed: the planner sees the owner with no
    helper to lend to, so the owner runs everything (what lending's impact compares with)."""

    def planner(self) -> Settings:
        return Settings(
            probe_idle_ms=self.probe_idle_ms,
            faster_slots=self.faster_slots,
            slower_slots=self.slower_slots,
            probe_slots=self.probe_slots,
            grant_ttl_ms=self.grant_ttl_ms,
        )


@dataclass
class BurstResult:
    burst: int
    requests: int
    first_arrival_ms: float
    makespan_ms: float
    lent: int
    returned: int
    helper_own_delay_ms: float
    leases: int
    waited_ms: float = 0.0
    """The burst's requests' time from arrival to answer, summed."""
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, held, lent out) after every event: what the plot draws."""


@dataclass(slots=True)
class _Job:
    seq: int
    request: Request
    owner_ms: float
    helper_ms: float
    price: float
    returned: bool = False
    done_ms: float | None = None
    lent: bool = False
    lent_at: float = 0.0
    admitted_at: float = 0.0


class _Sim:
    def __init__(
        self,
        pair: Pair,
        settings: ReplaySettings,
        requests: Sequence[Request],
        helper_own: Sequence[Request],
    ) -> None:
        self.pair = pair
        self.settings = settings
        self.plan_settings = settings.planner()
        self.events: list[tuple[float, int, str, object]] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.held: list[_Job] = []
        self.admitted: list[_Job] = []
        self.owner_running: _Job | None = None
        self.owner_last_done = 0.0
        self.lent_queue: list[_Job] = []  # lent, not started by the helper
        self.helper_running: _Job | str | None = None
        self.helper_own_waiting: list[tuple[float, float]] = []  # (arrival, duration)
        self.helper_loaded = pair.helper_loaded
        self.helper_last_own = -pair.helper_idle_ms
        self.lease: Lease | None = None
        self.lease_until = 0.0
        self.probe_at: float | None = None
        self.jobs: list[_Job] = []
        self.own_delay: dict[int, float] = {}
        self.leases: dict[int, int] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self.hold_deadline: dict[int, float] = {}
        self.holding: _Job | None = None
        self.current_burst = 0
        for request in requests:
            self._push(request.at_ms, "arrive", request)
        for own in helper_own:
            self._push(own.at_ms, "helper_own", own)

    # -- events ---------------------------------------------------------------------------

    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.counter), kind, payload))

    def run(self) -> None:
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.now = at
            if kind == "arrive":
                assert isinstance(payload, Request)
                self._arrive(payload)
            elif kind == "owner_done":
                assert isinstance(payload, _Job)
                self._owner_done(payload)
            elif kind == "helper_done":
                self._helper_done(payload)
            elif kind == "helper_own":
                assert isinstance(payload, Request)
                self._helper_own(payload)
            elif kind == "release":
                self._admit()
            elif kind == "probe" and self.probe_at is not None and at >= self.probe_at:
                self.probe_at = None
                self._plan()
            self.timeline_mark()

    def timeline_mark(self) -> None:
        out = sum(1 for job in self.lent_queue) + (
            1 if isinstance(self.helper_running, _Job) else 0
        )
        self.timeline.append((self.now, len(self.held), out))

    def _arrive(self, request: Request) -> None:
        pair = self.pair
        owner_ms = pair.owner_truth.predict(request.work)
        helper_fit = pair.helper_truth or pair.owner_truth
        helper_ms = helper_fit.predict(request.work)
        known_owner = pair.known.fit(pair.owner_node, pair.owner_model, pair.lane)
        price = known_owner.predict(request.work) if known_owner is not None else None
        job = _Job(
            seq=len(self.jobs),
            request=request,
            owner_ms=owner_ms if owner_ms is not None else pair.owner_truth.base_ms,
            helper_ms=helper_ms if helper_ms is not None else helper_fit.base_ms,
            price=price if price is not None else 0.0,
        )
        self.jobs.append(job)
        self.current_burst = request.burst
        self.held.append(job)
        self._admit()
        self._plan()

    def _admit(self) -> None:
        depth = max(1, self.settings.backend_depth)
        while self.held and len(self.admitted) < depth:
            # Requests that came back go first, then the oldest.
            job = min(self.held, key=lambda j: (not j.returned, j.request.at_ms, j.seq))
            if self.admitted and self._hold(job):
                lease = self.lease
                waiting = len(self.held)
                if lease is not None and self._out() < max(1, lease.helper_slots):
                    # With a lent slot free the held request goes to the helper at once.
                    self._lend()
                if len(self.held) < waiting:
                    continue
                break
            if self.holding is job:
                self.holding = None
            self.held.remove(job)
            job.admitted_at = self.now
            self.admitted.append(job)
        self._owner_start()

    def _hold(self, job: _Job) -> bool:
        """The owner keeps `job` for the helper (lending/hold.py's rule, with its prices):
        a slot behind a running job, a priced lease whose lent slots are all busy, and the
        helper predicted to finish it strictly sooner. Past that prediction plus one job it
        is released."""
        lease = self.lease
        if (
            not self.settings.hold_for_faster_helper
            or lease is None
            or self.now >= self.lease_until
            or not lease.knows_speeds()
            or job.returned
        ):
            return False
        out = self._out_jobs()
        job_ms = lease.owner_job_ms or 0.0
        service = lease.helper_service_ms or 0.0
        own_price, helper_price = job_ms, service
        if job.price > 0 and job_ms > 0:
            own_price, helper_price = job.price, service * job.price / job_ms
        owner = owner_finish_ms(
            now_ms=self.now,
            oldest_admitted_start_ms=min(j.admitted_at for j in self.admitted),
            last_own_completion_ms=self.owner_last_done if self.owner_last_done else None,
            in_flight=len(self.admitted),
            job_ms=job_ms,
            this_job_ms=own_price,
        )
        helper = helper_finish_ms(
            now_ms=self.now,
            lent_at_ms=[j.lent_at for j in out],
            switch_ms=lease.helper_switch_ms or 0.0,
            service_ms=service,
            this_job_ms=helper_price,
        )
        deadline = self.hold_deadline.setdefault(job.seq, helper + service)
        if self.now > deadline or helper >= owner:
            return False
        self.holding = job
        self._push(deadline + 1.0, "release", None)
        return True

    def _owner_start(self) -> None:
        if self.owner_running is None and self.admitted:
            job = self.admitted[0]
            self.owner_running = job
            self._push(self.now + job.owner_ms, "owner_done", job)

    def _owner_done(self, job: _Job) -> None:
        job.done_ms = self.now
        self.owner_running = None
        self.admitted.remove(job)
        self.owner_last_done = self.now
        self._admit()
        self._plan()

    # -- the helper -------------------------------------------------------------------------

    def _helper_own(self, request: Request) -> None:
        duration = request.work[0] if request.work else 0.0
        self.helper_own_waiting.append((self.now, duration))
        self.helper_last_own = self.now
        # Borrowed work the helper has not started goes back to its owner.
        for job in self.lent_queue:
            job.returned = True
            job.lent = False
            self.held.append(job)
        self.lent_queue.clear()
        self._helper_start()
        self._admit()
        self._plan()

    def _helper_start(self) -> None:
        if self.helper_running is not None:
            return
        if self.helper_own_waiting:
            arrived, duration = self.helper_own_waiting.pop(0)
            self.own_delay[self.current_burst] = self.own_delay.get(self.current_burst, 0.0) + (
                self.now - arrived
            )
            self.helper_running = "own"
            self._push(self.now + duration, "helper_done", "own")
            return
        if self.lent_queue:
            job = self.lent_queue.pop(0)
            self.helper_running = job
            switch = 0.0
            if not self.helper_loaded:
                pair = self.pair
                switch = pair.known.load_ms(pair.helper_node, pair.helper_config) or 0.0
                self.helper_loaded = True
            self._push(self.now + switch + job.helper_ms, "helper_done", job)

    def _helper_done(self, what: object) -> None:
        running = self.helper_running
        self.helper_running = None
        if running == "own":
            self.helper_last_own = self.now
            self._helper_start()
            self._plan()
            return
        assert isinstance(running, _Job)
        running.done_ms = self.now
        refill = self.lease is not None and not self.lease.probe and self.now < self.lease_until
        if refill:
            self._lend()
        self._helper_start()
        self._plan()

    # -- the master and the owner's lending ---------------------------------------------------

    def _out_jobs(self) -> list[_Job]:
        running = [self.helper_running] if isinstance(self.helper_running, _Job) else []
        return [*running, *self.lent_queue]

    def _out(self) -> int:
        return len(self._out_jobs())

    def _endpoints(self) -> tuple[Endpoint, LinkTarget]:
        pair = self.pair
        held = self.held
        backlog = [*held, *self.admitted]

        def work_sum(jobs: Sequence[_Job]) -> tuple[float, ...]:
            if not jobs:
                return ()
            terms = len(jobs[0].request.work)
            return tuple(sum(j.request.work[i] for j in jobs) for i in range(terms))

        lendable = [j for j in held if not j.returned]
        owner = Endpoint(
            node_id=pair.owner_node,
            model_id=pair.owner_model,
            config_filename=pair.owner_config,
            loaded=True,
            accepting_borrowed=False,
            idle_for_ms=0.0,
            context_capacity=pair.context_capacity,
            pending_count=len(held),
            lendable_count=len(lendable),
            pending_work=work_sum(held),
            sized_count=len(held),
            sized_work=work_sum(held),
            backlog_count=len(backlog),
            backlog_work=work_sum(backlog),
        )
        own_busy = self.helper_running == "own" or bool(self.helper_own_waiting)
        helper = Endpoint(
            node_id=pair.helper_node,
            model_id=pair.helper_model,
            config_filename=pair.helper_config,
            loaded=self.helper_loaded,
            accepting_borrowed=not own_busy,
            idle_for_ms=0.0 if own_busy else self.now - self.helper_last_own,
            context_capacity=pair.context_capacity,
            displaced_configs=(),
        )
        return owner, LinkTarget(helper, pair.load_if_unloaded, False)

    def _plan(self) -> None:
        owner, target = self._endpoints()
        result = plan_lane(
            lane=self.pair.lane,
            trigger="replay",
            owners=[(owner, [target] if self.settings.linked else [])],
            costs=self.pair.known,
            settings=self.plan_settings,
        )
        if result.leases:
            self.lease = result.leases[0]
            self.lease_until = self.now + self.lease.ttl_ms
            self.leases[self.current_burst] = self.leases.get(self.current_burst, 0) + 1
            self._lend()
        elif self.lease is not None and not self._kept(owner, target):
            self.lease = None
        if result.probe_due_ms is not None:
            due = self.now + max(1.0, result.probe_due_ms)
            if self.probe_at is None or due < self.probe_at:
                self.probe_at = due
                self._push(due, "probe", None)

    def _kept(self, owner: Endpoint, target: LinkTarget) -> bool:
        """Whether the master keeps the live lease this plan did not renew (lending/carry.py;
        its clock in seconds, the replay's in ms)."""
        lease = self.lease
        if lease is None:
            return False
        key = (self.pair.lane, owner.node_id, owner.model_id)
        kept = kept_leases(
            {key: (lease, self.lease_until / 1000.0)},
            {},
            {self.pair.lane: [(owner, [target] if self.settings.linked else [])]},
            self.now / 1000.0,
            "replay",
        )
        return key in kept

    def _lend(self) -> None:
        lease = self.lease
        if lease is None or self.now >= self.lease_until:
            return
        room = lease.helper_slots - self._out()
        while room > 0:
            lendable = [j for j in self.held if not j.returned]
            if not lendable:
                break
            # The request held for the helper goes first (it was kept for exactly this), then
            # the largest by the owner's price, newest first among equals.
            if self.holding is not None and self.holding in lendable:
                job = self.holding
                self.holding = None
            else:
                job = max(lendable, key=lambda j: (j.price, j.request.at_ms, j.seq))
            self.held.remove(job)
            job.lent = True
            job.lent_at = self.now
            self.lent_queue.append(job)
            room -= 1
        self._helper_start()


def replay(
    pair: Pair,
    settings: ReplaySettings,
    requests: Sequence[Request],
    helper_own: Sequence[Request] = (),
) -> list[BurstResult]:
    """Replay `requests` (sorted or not) and the helper's own requests (`work[0]` is each
    one's duration); one result per burst, in burst order."""
    sim = _Sim(pair, settings, sorted(requests, key=lambda r: r.at_ms), helper_own)
    sim.run()
    results: list[BurstResult] = []
    bursts = sorted({r.burst for r in requests})
    for burst in bursts:
        jobs = [j for j in sim.jobs if j.request.burst == burst]
        first = min(j.request.at_ms for j in jobs)
        last = max((j.done_ms if j.done_ms is not None else NEVER_MS) for j in jobs)
        end = max(last, first)
        results.append(
            BurstResult(
                burst=burst,
                requests=len(jobs),
                first_arrival_ms=first,
                makespan_ms=end - first,
                lent=sum(1 for j in jobs if j.lent),
                returned=sum(1 for j in jobs if j.returned),
                helper_own_delay_ms=sim.own_delay.get(burst, 0.0),
                leases=sim.leases.get(burst, 0),
                waited_ms=sum(
                    (j.done_ms if j.done_ms is not None else NEVER_MS) - j.request.at_ms
                    for j in jobs
                ),
                timeline=[t for t in sim.timeline if first <= t[0] <= end],
            )
        )
    return results
