"""The churn bench's queues (bench/churn.py): Volt's queue today, and `volt_goodput`, Volt's queue with
locality bounds, reservations and backfill (issue 28: clusters/locality.py, clusters/reservations.py).

Both honour team quotas (clusters/quotas.py): every request belongs to one of TEAMS teams, a share of
the teams (`--quota-share`) has a cap on GPUs in use, and a request over its team's cap waits. Every
policy of the bench runs the same quotas; `quota_violations` counts allocations that left a team above
its cap (the check is independent of the rule that prevents them).

volt_goodput, at each drain, in queue order (first come first served):
- a collective multi-node request waits up to `locality_wait_s` after its arrival for one site, if a
  site of its model could ever hold it (capacity, not occupancy), then is placed as written;
- the first `reservations` requests that cannot start get a reservation: the earliest time some hosts
  can give their nodes (free GPUs now plus those of running jobs that end by then, by the jobs'
  requested ends), on those hosts: the request's start bound;
- a request behind a reservation starts only on hosts outside it, or on its hosts if it ends (by its
  requested duration) before the reservation starts: conservative backfill over whole hosts.
Requested durations come from the trace: requested = actual run time x a factor drawn per job from
OVER_ASK (users over-ask), so no job runs past its request and Volt never terminates one here.
Reservations are kept between drains and planned again every RESERVATION_REFRESH_S of simulated time
(Volt plans them every drain, every 30 s; a bench at 10,000 hosts cannot afford it per event).
`starved`: requests that started later than the first start bound they were given (or still wait
past it at the end).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from clusters.placement import HostSnapshot, PlacementRequest, Plan

TEAMS = 40
QUOTA_FAIR_SHARE = 1.5  # a capped team may hold this many times its fair share (GPUs / TEAMS)
OVER_ASK = (1.0, 3.0)  # requested duration = actual x uniform(OVER_ASK)
RESERVATION_REFRESH_S = 300.0
LOCALITY_WAIT_S = 1800.0  # Volt's VOLT_LOCALITY_WAIT_S default
RESERVATIONS = 4  # Volt's VOLT_QUEUE_RESERVATIONS default
BOUND_SLACK_S = 1.0


class Quotas:
    """Team caps on GPUs in use (the same for every policy): which team each request belongs to, which
    teams are capped, and their use."""

    def __init__(self, trace_length: int, total_gpus: int, share: float, seed: int):
        rng = random.Random(seed + 2)
        self.team_of = [rng.randrange(TEAMS) for _ in range(trace_length)]
        capped = rng.sample(range(TEAMS), round(share * TEAMS))
        cap = max(512, round(QUOTA_FAIR_SHARE * total_gpus / TEAMS))  # a 64x8 request always fits one
        self.cap = {team: cap for team in capped}
        self.used: Counter = Counter()
        self.violations = 0
        self.refusals = 0  # times a request that fit waited for its team's cap

    def admits(self, job) -> bool:
        team = self.team_of[job.number]
        ok = team not in self.cap or self.used[team] + _gpus(job.request) <= self.cap[team]
        return ok

    def take(self, job) -> None:
        team = self.team_of[job.number]
        self.used[team] += _gpus(job.request)
        if team in self.cap and self.used[team] > self.cap[team]:
            self.violations += 1

    def give(self, job) -> None:
        self.used[self.team_of[job.number]] -= _gpus(job.request)


def _gpus(request: PlacementRequest) -> int:
    return request.nodes * request.gpus_per_node


def start(state, job, result: Plan, now: float, events, running_on, slowdown, quotas: Quotas) -> None:
    """Allocate `result` to `job` from now (every policy)."""
    job.wait_s += now - job.queued_since_s
    job.plan = result
    job.first_plan = job.first_plan or result
    job.slowdown = slowdown(job.request, result)
    state.allocate(job)
    quotas.take(job)
    for node in result.nodes:
        running_on.setdefault(node.host_id, set()).add(job.number)
    job.placed, job.end_s = True, now + job.remaining_s * job.slowdown
    job.requested_end_s = now + job.remaining_s * job.slowdown * job.over_ask
    if job.started_s is None:  # its first start (a host failure may requeue it later)
        job.started_s = now
    heapq.heappush(events, (job.end_s, 0, "end", job.number))


def stop(state, job, running_on, quotas: Quotas) -> None:
    """Give back a job's GPUs (it ended, or its host failed)."""
    state.release(job)
    quotas.give(job)
    for node in job.plan.nodes:
        running_on.get(node.host_id, set()).discard(job.number)
    job.placed = False


def drain_today(state, queue: list, now: float, events, running_on, slowdown, quotas: Quotas) -> None:
    """Volt's queue today: priority, then FIFO; a request that does not fit (or is over its team's
    quota) is skipped."""
    still = []
    for job in queue:
        result = state.place(job.request) if quotas.admits(job) else None
        if result is None:
            still.append(job)
            continue
        start(state, job, result, now, events, running_on, slowdown, quotas)
    queue[:] = still


@dataclass
class Window:
    job: int
    start_s: float
    end_s: float
    hosts: frozenset[str]
    level: str | None = None  # "site" or "region" when its hosts are in one; planned so until it starts


@dataclass
class GoodputQueue:
    """volt_goodput's queue (the module docstring): its reservations persist between drains."""

    hosts: list[HostSnapshot]
    locality_wait_s: float = LOCALITY_WAIT_S
    reservations: int = RESERVATIONS
    span_wait_s: float = math.inf  # how much later a reservation in one site (region) may start
    windows: dict[int, Window] = field(default_factory=dict)
    refreshed_s: float = -math.inf
    site_hosts: dict[str, int] = field(default_factory=dict)  # model -> hosts in its largest site
    _usable: dict[tuple, list[str]] = field(
        default_factory=dict
    )  # per drain: reserved hosts backfill may use

    def __post_init__(self):
        per_site: Counter = Counter((h.gpu_model, h.path.site_id) for h in self.hosts)
        for (model, _), count in per_site.items():
            self.site_hosts[model] = max(self.site_hosts.get(model, 0), count)

    def drain(
        self, state, queue: list, now: float, events, running_on, slowdown, quotas: Quotas, jobs
    ) -> None:
        queued = {job.number for job in queue}
        for number in [n for n in self.windows if n not in queued]:
            self._drop(state, number)  # placed (or preempted and queued again: planned afresh)
        if now - self.refreshed_s >= RESERVATION_REFRESH_S:
            self._replan(state, queue, now, running_on, jobs, quotas)
            self.refreshed_s = now
        still = []
        self._usable.clear()
        for job in queue:
            if not quotas.admits(job):
                job.quota_blocked |= job.bound_s is not None  # its own team's use holds it, not the queue
                still.append(job)
                continue
            own = self.windows.get(job.number)
            # Its own reservation is its to use: the hosts of it that can give a node now are shown to it.
            mine = self._ready(state, own, job.request) if own is not None else []
            state.hide(mine, False)
            result = self._plan(state, job, now, slowdown, own)
            if result is not None:
                start(state, job, result, now, events, running_on, slowdown, quotas)
                if own is not None:
                    self._drop(state, job.number)
                self._check_bound(job, now)
                self._usable.clear()
                continue
            state.hide(mine, True)
            still.append(job)
        queue[:] = still

    def _replan(self, state, queue: list, now: float, running_on, jobs, quotas: Quotas) -> None:
        """Reservations again: first for the requests that hold one (in queue order: a reservation given is
        kept, or moved earlier, so a later arrival of any priority never pushes it back), then for the
        others in queue order, up to `reservations`. Hosts in both the old and new sets stay hidden."""
        old, self.windows = self.windows, {}
        order = [job for job in queue if job.number in old] + [job for job in queue if job.number not in old]
        for job in order:
            if len(self.windows) >= self.reservations:
                break
            if quotas.admits(job) and not self._waiting_for_site(job, now):
                self._reserve(state, job, now, running_on, jobs)
        before, after = self._hidden(old.values()), self._hidden()
        state.hide(after - before, True)
        state.hide(before - after, False)

    @staticmethod
    def _ready(state, window: Window, request: PlacementRequest) -> list[str]:
        return [
            h
            for h in window.hosts
            if h not in state.down and state.hosts[h].free_count() >= request.gpus_per_node
        ]

    def _plan(self, state, job, now: float, slowdown, own: Window | None = None) -> Plan | None:
        request = job.request
        if self._waiting_for_site(job, now):
            request = replace(request, topology_level="site", topology_mode="required")
        elif own is not None and own.level and now < own.start_s:  # it waits for its reservation's span
            request = replace(request, topology_level=own.level, topology_mode="required")
        result = state.place(request)
        if result is not None or not self.windows:
            return result
        # Backfill onto reserved hosts: those of reservations that start after this job's requested end and
        # that can give one of its nodes now (a reserved host is usually busy until its reservation).
        # Reservations hold disjoint hosts; the usable ones are cached per drain (cleared on every start).
        end = now + job.remaining_s * job.over_ask
        starts = sorted(w.start_s for w in self.windows.values())
        first_later = bisect.bisect_left(starts, end)
        if first_later == len(starts):
            return None
        key = (starts[first_later], request.models[0], request.gpus_per_node)
        usable = self._usable.get(key)
        if usable is None:
            later = [w for w in self.windows.values() if w.start_s >= end]
            usable = self._usable[key] = [
                h
                for w in later
                for h in w.hosts
                if h not in state.down
                and state.hosts[h].gpu_model == key[1]
                and state.hosts[h].free_count() >= key[2]
            ]
        if not usable:
            return None
        state.hide(usable, False)
        result = state.place(request)
        state.hide(usable, True)
        if result is None:
            return None
        # Its requested end counts its speed on this plan (start() sets it so): a backfill that would run
        # into a reservation on the hosts it took is no backfill.
        end = now + job.remaining_s * job.over_ask * slowdown(request, result)
        used = set(result.host_ids)
        if any(w.start_s < end and w.hosts & used for w in self.windows.values()):
            return None
        return result

    def _waiting_for_site(self, job, now: float) -> bool:
        request = job.request
        return (
            request.is_collective()
            and now < job.arrival_s + self.locality_wait_s
            and self.site_hosts.get(request.models[0], 0) >= request.nodes
        )

    def _reserve(self, state, job, now: float, running_on, jobs) -> None:
        """The earliest time `job.request.nodes` hosts outside other reservations can each give a node,
        from the requested ends of what runs on them; those hosts are held from then."""
        request = job.request
        taken = self._hidden()  # reservations of requests ahead, planned in this refresh
        ready: list[tuple[float, str]] = []
        for host_id in state.by_model[request.models[0]]:
            if host_id in taken or host_id in state.down:
                continue
            host = state.hosts[host_id]
            if host.total_gpus < request.gpus_per_node:
                continue
            free = host.free_count()
            at = now
            if free < request.gpus_per_node:
                ends = sorted(
                    (jobs[n].requested_end_s, sum(len(ix) for h, ix in jobs[n].hosts if h == host_id))
                    for n in running_on.get(host_id, ())
                )
                at = math.inf
                for end, gpus in ends:
                    free += gpus
                    if free >= request.gpus_per_node:
                        at = end
                        break
            ready.append((at, host_id))
        chosen = self._tightest(state, request, ready)
        if chosen is None:
            return
        start_s = max(now, chosen[-1][0])
        if math.isinf(start_s):
            return
        window = Window(
            job.number,
            start_s,
            start_s + job.remaining_s * job.over_ask,
            frozenset(h for _, h in chosen),
            _level_of(state, chosen) if request.is_collective() else None,
        )
        self.windows[job.number] = window
        if job.bound_s is None:
            job.bound_s = start_s

    def _tightest(self, state, request, ready: list[tuple[float, str]]) -> list[tuple[float, str]] | None:
        """The hosts to reserve: the earliest that can each give a node, in one site if that starts at most
        the locality wait later than anywhere (one region, the same), else anywhere. As Volt's
        reservations: a collective job started on scattered hosts runs many times slower."""
        if len(ready) < request.nodes:
            return None
        anywhere = heapq.nsmallest(request.nodes, ready)
        if not request.is_collective():
            return anywhere
        for level in ("site_id", "region"):
            groups: dict[str, list[tuple[float, str]]] = {}
            for at, host_id in ready:
                groups.setdefault(getattr(state.hosts[host_id].path, level), []).append((at, host_id))
            best = None
            for members in groups.values():
                if len(members) >= request.nodes:
                    chosen = heapq.nsmallest(request.nodes, members)
                    if best is None or chosen[-1][0] < best[-1][0]:
                        best = chosen
            if best is not None and best[-1][0] <= anywhere[-1][0] + self.span_wait_s:
                return best
        return anywhere

    def _hidden(self, windows=None) -> frozenset[str]:
        chosen = self.windows.values() if windows is None else windows
        return frozenset().union(*(w.hosts for w in chosen))

    def _drop(self, state, number: int) -> None:
        window = self.windows.pop(number)
        state.hide(window.hosts - self._hidden(), False)

    @staticmethod
    def _check_bound(job, now: float) -> None:
        """Late: its first start came after the first bound it was given (a restart after a host failure
        is not a start bound's business)."""
        if job.bound_s is not None and job.started_s > job.bound_s + BOUND_SLACK_S:
            job.late = True


def late(jobs, queue, horizon: float) -> list:
    """Requests that started after their first start bound, or still wait past it at the end."""
    waiting = {
        job.number
        for job in queue
        if job.started_s is None and job.bound_s is not None and horizon > job.bound_s + BOUND_SLACK_S
    }
    return [job for job in jobs if job.late or job.number in waiting]


def starved(jobs, queue, horizon: float) -> int:
    """Late requests (`late`) whose own team's quota never held them after they got their bound: late
    because of the queue. (Over its cap a request has no bound in Volt: clusters/reservations.py.)"""
    return sum(1 for job in late(jobs, queue, horizon) if not job.quota_blocked)


def _level_of(state, hosts: list[tuple[float, str]]) -> str | None:
    paths = [state.hosts[h].path for _, h in hosts]
    if len({p.site_id for p in paths}) == 1:
        return "site"
    return "region" if len({p.region for p in paths}) == 1 else None
