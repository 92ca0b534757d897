"""The re-replication auditor (DESIGN.md §6): re-replicate what lost agents held, and refill
what live agents lack, unattended.

Every agent with ``[auditor] enabled = true`` stands in a ZooKeeper election at
``/dlctl/<cluster>/auditor-election``; the one elected is the auditor. ZooKeeper sessions are
the failure detector: when the auditor's agent dies, its election znode vanishes with its
session and the next contender takes over.

Who is "gone": an agent registered in ``nodes/`` (``dlctl cluster init``) or seen in
``available/`` at some point during this agent's life, which is now absent from
``available/``. Agents that skipped ``cluster init`` (sandbox, tests) are covered by the second
rule; the price is that an agent this process never saw, and that is not registered, is never
audited: a fresh auditor cannot tell "gone" from "never existed".

The grace period is measured from when *this* agent first saw the absence, and reset when the
agent comes back. Every contender observes (cheap: two child listings per check), so a new
auditor that takes over has a head start, but it never acts before it has itself seen an agent
missing for longer than the grace.

Switches: ``[auditor] enabled = false`` in an agent's configuration keeps that agent out of the
election; ``{"enabled": false}`` in the znode ``/dlctl/<cluster>/auditor`` turns auditing off
for the whole cluster (``dlctl cluster auditor disable``; ``dlctl.meta.roles``). While it is off, observations are dropped, so
after switching it back on the grace period starts again.

Live replicas too: at every check the elected auditor surveys the replicas the available agents
hold against the completed segments' records (``dlctl.log.repair``) and refills, in place, every
replica that is missing, in limbo (corrupt, cut, or forgotten with a replaced disk) or short of
the entries its record names; every DEEP_EVERY-th survey also compares the members' digests and
replaces a replica that disagrees with a strict majority of its peers. The election makes it the only one repairing; repairs are
idempotent (recovery adds of identical bytes, digest-verified), so one cut short is redone.

Safety: the auditor acts only while elected *and* connected. When its ZooKeeper connection is
suspended or its session lost, the re-replication under way is cancelled at once (it is
resumable: the op record under ``ops/`` is continued by the next run, whoever runs it), and
every metadata change is a compare-and-set anyway, so a deposed auditor racing its successor
in the short window before the cancellation lands loses the CAS instead of overwriting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError

from dlctl.log import rereplicator as rr
from dlctl.log.auth import Credentials
from dlctl.meta import paths, roles
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth
from dlctl.ratelimit import TokenBucket

from .config import AuditorSettings
from .election import ElectedRole
from .metrics import AgentMetrics

log = logging.getLogger("dlagent.auditor")


# The two kinds of work whose segments make up dlagent_repair_pending_segments.
REREPLICATION = "rereplication"  # replicas of agents gone past the grace, copied to new members
REFILL = "refill"  # live members' replicas missing, damaged or short, refilled in place

# Every DEEP_EVERY-th survey also compares the members' digests (a request per replica, so not at
# every check): divergent replicas are found within DEEP_EVERY x check_seconds.
DEEP_EVERY = 30


def switch_path(cluster: str) -> str:
    return roles.auditor_switch_path(cluster)


def election_path(cluster: str) -> str:
    return roles.election_path(cluster, "auditor")


# -- the pure bookkeeping: who has been gone for longer than the grace -----------------------------


@dataclass
class GoneTracker:
    """Agents missing from ``available/`` and since when (monotonic seconds), by observation.

    ``observe`` is fed the registered agents (``nodes/``) and the available ones; an agent is
    known once it is registered or has been seen available. A known agent that is not available
    is missing from the first observation that does not see it; it is *due* once it has been
    missing for strictly longer than ``grace``. Seeing it available again forgets the absence.
    """

    grace: float
    seen: set[str] = field(default_factory=set)
    missing_since: dict[str, float] = field(default_factory=dict)
    regions: dict[str, str | None] = field(default_factory=dict)

    def observe(self, now: float, registered: Mapping[str, str | None], available: Mapping[str, str | None]) -> None:
        """``registered`` / ``available``: node id -> region (None when unknown)."""
        for node, region in list(registered.items()) + list(available.items()):
            if region is not None or node not in self.regions:
                self.regions[node] = region
        self.seen |= set(available)
        for node in set(available):
            self.missing_since.pop(node, None)  # back (or never gone): the grace starts over
        for node in (set(registered) | self.seen) - set(available):
            self.missing_since.setdefault(node, now)

    def due(self, now: float) -> list[str]:
        return sorted(n for n, since in self.missing_since.items() if now - since > self.grace)

    def reset(self) -> None:
        """Forget every absence (auditing switched off): the grace starts again when back on."""
        self.missing_since.clear()


# -- the cluster-wide switch (its znode and format live in dlctl.meta.roles) ---------------------

read_cluster_switch = roles.read_auditor_switch
set_cluster_switch = roles.write_auditor_switch


# -- the auditor -------------------------------------------------------------------------------------


class Auditor(ElectedRole):
    """Two threads (kazoo is thread-based): one contends in the election and holds the role
    while elected; the other observes every ``check_seconds`` and, while elected, acts."""

    role = "re-replication auditor"
    metrics_role = "auditor"

    def __init__(
        self,
        client: KazooClient,
        cluster: str,
        node_id: str,
        secret: Credentials | bytes,  # the cluster secret and TLS files, for its agent pool
        settings: AuditorSettings,
        auth: ZkAuth | None = None,
        *,
        parallel: int = 4,
        clock: Callable[[], float] = time.monotonic,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.client, self.cluster, self.node_id, self.secret, self.auth = client, cluster, node_id, secret, auth
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.settings = settings
        self.parallel = parallel
        self.clock = clock
        self.meta = MetaStore(client, cluster, auth)
        self.tracker = GoneTracker(settings.grace_seconds)
        self.operations = 0  # re-replication runs started by this agent (for tests and stats)
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._leader_exit = threading.Event()  # tells the leader function to give up the role
        self._connected = threading.Event()
        if client.state == KazooState.CONNECTED:
            self._connected.set()
        self._guard = threading.Lock()
        self._election: Any = None
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._settled: frozenset[str] | None = None  # the due set whose plan had nothing left to do
        self._failures = 0
        self._switch_on: bool | None = None  # the cluster-wide switch as last read
        self._retry_at = 0.0
        self._said: set[str] = set()  # messages logged once, not at every check
        self._threads: list[threading.Thread] = []
        self.last_survey: Any = None  # the last replica-health survey (dlctl.log.repair.Survey)
        self._surveys = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Auditor:
        self.client.add_listener(self._on_state)
        for target, name in ((self._election_loop, "auditor-election"), (self._check_loop, "auditor-check")):
            # Daemon threads: a stuck ZooKeeper call must not keep a stopping agent alive.
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("auditor started: grace %gs, check every %gs", self.settings.grace_seconds, self.settings.check_seconds)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave the election and stop; a re-replication under way is cancelled (it resumes
        from its op record under the next auditor)."""
        self._stop.set()
        self._leader_exit.set()
        with self._guard:
            if self._election is not None:
                self._election.cancel()
        self._cancel_running("the agent is stopping")
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("auditor thread %s did not stop within %gs", thread.name, timeout)
        self.client.remove_listener(self._on_state)
        log.info("auditor stopped")

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    # -- ZooKeeper connection: the failure detector ---------------------------------------------

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flips flags and schedules a cancellation.
        if state == KazooState.CONNECTED:
            self._connected.set()
            return
        self._connected.clear()
        # SUSPENDED: the session may already have expired at the server and someone else been
        # elected; LOST: it has. Either way stop acting now; on SUSPENDED we may resume once
        # reconnected with the same session (the election znode, hence the role, survived).
        self._cancel_running(f"ZooKeeper connection {state.lower()}")
        if state == KazooState.LOST:
            self._leading.clear()
            self._leader_exit.set()

    def _cancel_running(self, why: str) -> None:
        with self._guard:
            if self._running is not None:
                loop, task = self._running
                log.warning("interrupting re-replication: %s (it is resumable)", why)
                loop.call_soon_threadsafe(task.cancel)

    # -- the election --------------------------------------------------------------------------

    def _election_path(self) -> str:
        return election_path(self.cluster)

    def _lead(self) -> None:
        """Called by kazoo while this agent holds the election lock; returning gives it up."""
        if self._leader_exit.is_set() or self._stop.is_set():
            return
        log.info("elected re-replication auditor of cluster %s", self.cluster)
        self._leading.set()
        try:
            self._leader_exit.wait()
        finally:
            self._leading.clear()
            self._cancel_running("no longer the elected auditor")
            # Its numbers are the next auditor's to report: a sum over the cluster counts once.
            self.metrics.under_replicated(0)
            for kind in (REREPLICATION, REFILL):
                self.metrics.repair_pending(kind, 0)
            log.info("no longer the re-replication auditor")

    # -- the checks ----------------------------------------------------------------------------

    def _check_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception:
                log.exception("auditor check failed; retrying in %gs", self.settings.check_seconds)
            self._stop.wait(self.settings.check_seconds)

    def check_once(self) -> list[str]:
        """Observe, and act on the agents gone past the grace when elected; returns them."""
        if not self._connected.is_set():
            return []  # a listing through a broken connection says nothing about the agents
        enabled, problem = read_cluster_switch(self.client, self.cluster)
        if problem:
            self._say(problem, logging.ERROR)
        if enabled != self._switch_on:
            self._switch_on = enabled
            if not enabled:
                log.warning("auditor: auditing is switched off cluster-wide (%s); no agent is re-replicated until it is back on", switch_path(self.cluster))
            else:
                log.info("auditor: auditing is on for cluster %s", self.cluster)
        leading = self._leading.is_set()
        registered = self._registered()
        # Only the auditor reads every availability record (for the lost agents' regions);
        # the others need the names alone.
        if leading:
            available = {n: i.get("region") for n, i in self.meta.available_nodes().items()}
        else:
            available = dict.fromkeys(self._children(paths.available(self.cluster)))
        now = self.clock()
        if not enabled:
            # Still learn which agents exist (one that dies while auditing is off must be known
            # once it is back on), but forget every absence: a full grace runs again then.
            self.tracker.observe(now, registered, available)
            self.tracker.reset()
            self._settled = None
            return []
        before = set(self.tracker.missing_since)
        self.tracker.observe(now, registered, available)
        after = set(self.tracker.missing_since)
        for node in sorted(after - before):
            log.info("auditor: agent %s is gone; its replicas are re-replicated if it stays gone for more than %gs", node, self.settings.grace_seconds)
        for node in sorted(before - after):
            log.info("auditor: agent %s is back; nothing to re-replicate for it", node)
        due = self.tracker.due(now)
        if not due:
            self._settled = None
        if not leading:
            return due
        if not due:
            self.metrics.repair_pending(REREPLICATION, 0)
        if due and frozenset(due) != self._settled and now >= self._retry_at:
            self._act(due)
        if self._may_act():
            self._repair_live()
        return due

    def _children(self, path: str) -> list[str]:
        try:
            return self.client.get_children(path)
        except NoNodeError:
            return []

    def _registered(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for node in self._children(paths.nodes(self.cluster)):
            region = None
            if self._leading.is_set():
                try:
                    data, _ = self.client.get(paths.node(self.cluster, node))
                    region = json.loads(data).get("region")
                except (NoNodeError, ValueError, AttributeError):
                    pass
            out[node] = region
        return out

    def _say(self, message: str, level: int = logging.INFO) -> None:
        if message not in self._said:
            self._said.add(message)
            log.log(level, "%s", message)

    def _may_act(self) -> bool:
        return self._leading.is_set() and self._connected.is_set() and not self._stop.is_set()

    def _act(self, due: list[str]) -> None:
        built = rr.plan(self.meta, due, lost_regions={n: self.tracker.regions.get(n) for n in due})
        for note in built.notes:
            self._say(f"auditor: {note}", logging.WARNING if "lost" in note or "cannot" in note else logging.INFO)
        actionable = [w for w in built.work if not w.data_lost and (not w.blocked or w.recover_first)]
        waiting = [w for w in built.work if w.blocked and not w.recover_first and not w.data_lost]
        if not actionable:
            self.metrics.repair_pending(REREPLICATION, len(waiting))
            if not waiting:
                # Nothing left (or only data that no replica holds any more, reported above):
                # do not re-plan every check until the set of gone agents changes.
                self._settled = frozenset(due)
                self._say(f"auditor: nothing (more) to re-replicate for gone agent(s) {', '.join(due)}")
            return
        # Last look before acting: still the auditor, and every agent still gone (one that came
        # back after the listing keeps its replicas; the next observation resets its grace).
        if not self._may_act():
            return
        back = set(due) & set(self._children(paths.available(self.cluster)))
        if back:
            log.info("auditor: %s came back; not re-replicating", ", ".join(sorted(back)))
            return
        log.warning(
            "auditor: agent(s) %s gone for more than %gs: re-replicating %d segment(s)%s",
            ", ".join(due), self.settings.grace_seconds, len(actionable),
            f" (continuing operation {built.op_id})" if built.op_id else "",
        )
        self.operations += 1
        rate = self.settings.max_bytes_per_second
        throttle = TokenBucket(rate) if rate > 0 else None
        metrics = self.metrics
        metrics.repair_pending(REREPLICATION, len(built.work))

        def progress(p: rr.Progress) -> None:
            metrics.repair_pending(REREPLICATION, p.total_segments - p.finished)

        report = self._run_cancellable(lambda pool: rr.execute(self.meta, pool, built, parallel=self.parallel, throttle=throttle, on_progress=progress))
        if report is None:
            return
        metrics.repaired(report["bytes"], {"done": report["committed"], "stuck": len(report["stuck"]), "data_lost": len(report["data_lost"])})
        metrics.repair_pending(REREPLICATION, len(report["stuck"]))
        if report["stuck"]:
            self._failures += 1
            delay = min(300.0, self.settings.check_seconds * 2 ** self._failures)
            self._retry_at = self.clock() + delay
            log.error(
                "auditor: operation %s: %d of %d segment(s) re-replicated, stuck on %s; retrying in %gs",
                report["operation"], report["committed"], report["segments"],
                "; ".join(f"segment {o['segment']} of {o['log']}: {o['error']}" for o in report["stuck"]), delay,
            )
        else:
            self._failures, self._retry_at = 0, 0.0
            log.warning(
                "auditor: operation %s: %d of %d segment(s) re-replicated (%d entries, %d bytes in %.1fs)",
                report["operation"], report["committed"], report["segments"], report["entries"], report["bytes"], report["seconds"],
            )

    def _repair_live(self) -> None:
        """Refill, in place, the replicas that live agents are missing or hold damaged or short
        (dlctl.log.repair): the causes a gone-agent check cannot see."""
        from dlctl.log import repair

        self._surveys += 1
        deep = self._surveys % DEEP_EVERY == 1  # the first survey, then every DEEP_EVERY-th

        metrics = self.metrics

        async def work(pool: Any) -> tuple[Any, Any]:
            found = await repair.survey(self.meta, pool, deep=deep)
            for name, why in sorted(found.unreadable.items()):
                log.warning("auditor: replicas of log %r not checked, its metadata cannot be read: %s", name, why)
            metrics.under_replicated(len(found.under_replicated()))
            todo = {(p.log, p.segment) for p in found.problems if p.cause in repair.REPAIRABLE}
            metrics.repair_pending(REFILL, len(todo))
            if not todo:
                return found, None
            return found, await repair.repair(
                self.meta, pool, found, parallel=self.parallel, max_bytes_per_second=self.settings.max_bytes_per_second, holder=f"auditor {self.node_id}"
            )

        out = self._run_cancellable(work)
        if out is None:
            return
        found, report = out
        self.last_survey = found
        if report is None:
            return
        refilled = {(r["log"], r["segment"]) for r in report.repaired}
        stuck = {(r["log"], r["segment"]) for r in report.stuck}
        metrics.repaired(sum(r["bytes"] for r in report.repaired), {"done": len(refilled), "stuck": len(stuck)})
        metrics.repair_pending(REFILL, len(stuck))
        for done in report.repaired:
            log.warning("auditor: refilled %s replica of segment %d of log %r on %s (%d entries)", done["cause"], done["segment"], done["log"], done["node"], done["entries"])
        for stuck in report.stuck:
            self._say(f"auditor: cannot repair {stuck['cause']} replica of segment {stuck['segment']} of log {stuck['log']!r} on {stuck['node']}: {stuck['error']}", logging.ERROR)

    def _run_cancellable(self, work: Callable[[Any], Any]) -> Any:
        """``await work(pool)`` on a private event loop, cancellable from other threads (a lost
        role or connection cancels it; the work is resumable or idempotent)."""
        from dlctl.log.pool import AgentPool

        async def go() -> Any:
            task = asyncio.current_task()
            assert task is not None
            with self._guard:
                # Checked under the guard the cancellers take: once registered, any later loss
                # of the role or the connection cancels this task.
                if not self._may_act():
                    return None
                self._running = (asyncio.get_running_loop(), task)
            pool = AgentPool(self.meta, self.secret)
            try:
                return await work(pool)
            finally:
                with self._guard:
                    self._running = None
                await pool.close()

        try:
            return asyncio.run(go())
        except asyncio.CancelledError:
            log.warning("auditor: interrupted; the next run continues where this one stopped")
            return None

