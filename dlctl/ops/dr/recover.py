"""``dr recover``: a location X lost all or part of its data; it gets it back from its peers.

What X lost of its ZooKeeper metadata too (rebuilt empty, an old backup) is first recreated from
its peers' records (``dlctl.ops.dr.rebuild``). Then metadata first — X's logs frozen, lost
segments dropped from the metadata, X's clock raised above every counter of X any directly
connected peer has seen, the peers' progress on streams from X reset to what X still has — then
events: every stream into X restarts from its source's beginning with the unfiltered causality
filter (X's own records come back), drains, and returns to normal. Resumable: an operation
record in X's ZooKeeper remembers the steps done; re-running continues after the last one.

A peer that deleted the beginning of a log (``dlctl.ops.dr.truncated``): its stream restarts at
its first retained position with its clock there; into a log X holds nothing of, a bootstrap
copy (Spark) of what it retains goes first (step ``bootstrap``), else the unfiltered filter
skips what X kept. What it deleted is reported as a gap (``recover_gaps``; the CLI exits 3 when
no other stream into X holds that log whole) — unless the peer's cold store holds it
(``dlctl.ops.dr.cold``): then step ``cold-restore`` replays it into X before the stream goes on.

Here the plan is assembled: the facts read once (``recover_facts``), the decisions
(``recover_decide``), the steps and their actions (``recover_steps``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from ...plan import Plan, PlanResult, Step
from ...session import ClusterSession
from . import recover_steps as act
from .rebuild import plan_rebuild
from .recover_decide import recovered_logs, refuse_nothing_to_recover, truncated_notes
from .recover_facts import read_outgoing, read_record, read_truncations


def recover_plan(target: ClusterSession, peers: dict[str, ClusterSession], *, wait_workers: float = 30.0, drain_timeout: float = 600.0) -> Plan:
    x = target.cluster.name
    outgoing = read_outgoing(x, peers)
    # X's metadata as its peers know it (X rebuilt empty, or an old backup): what X lost of it
    # is recreated first; streams recreated count as running before the loss.
    rebuilt = plan_rebuild(target, peers)
    incoming = tuple(rebuilt.incoming)
    refuse_nothing_to_recover(x, incoming)
    logs = tuple(recovered_logs(incoming, outgoing))
    record = read_record(target, act.OP_ID)
    done = set(record.value.get("done", [])) if record is not None else set()
    r = act.Recovery(target, peers, incoming, outgoing, logs, rebuilt.modes, act.OpRecord(target.meta, record), wait_workers, drain_timeout, time.monotonic())
    where_logs = f"{x}/{','.join(logs)}"
    all_steps = [
        *rebuilt.steps,
        Step("begin", f"{x}+peers", f"pause the {len(incoming)} stream(s) into {x} and the {len(outgoing)} out of it; freeze {x}'s logs (read-only)", run=partial(act.begin, r), piecewise=True),
        Step("drop-lost", where_logs, f"find the segments of {x}'s logs no replica can serve and drop them from the metadata (what {x} still has stays)", run=partial(act.drop_lost, r)),
        Step("raise-clock", where_logs, f"raise {x}'s clock above every counter of {x} its peers have seen (so {x} never reuses a timestamp)", run=partial(act.raise_clock, r)),
        Step("reset-outgoing", ",".join(sorted({o.peer for o in outgoing})) or "-", f"reset the peers' progress on streams from {x} to what {x} still has", run=partial(act.reset_outgoing_streams, r)),
        Step("reset-incoming", x, f"restart every stream into {x} from its source's beginning (or first retained position), unfiltered ({x}'s own records come back)", run=partial(act.reset_incoming_streams, r)),
        Step("cold-restore", x, f"where a peer deleted the beginning of a log and its cold store holds it: replay those records into {x} from the copies", run=partial(act.cold_restore, r)),
        Step("bootstrap", x, f"where a peer deleted the beginning of a log {x} holds nothing of: copy what the peer retains (Spark), then stream on from there", run=partial(act.bootstrap, r), piecewise=True),
        Step("events", x, f"wait until {x} has every record its peers hold (timeout {drain_timeout:g}s per stream)", run=partial(act.events, r)),
        Step("finish", x, "streams back to normal filtering and to their states before; logs back to their access modes", run=partial(act.finish, r)),
    ]
    steps = [st for st in all_steps if st.action not in done]
    notes = [*rebuilt.notes, f"peers: {', '.join(sorted(peers))}; logs: {', '.join(logs)}"]
    notes += truncated_notes(x, incoming, read_truncations(peers, ((c.source_cluster, n) for c, _ in incoming for n in c.logs)))
    if record is not None:
        notes.insert(0, f"continuing the dr recover of {x} started before (done: {', '.join(sorted(done)) or 'nothing'})")
    return Plan.of(f"dr recover {x}", steps, notes)


def recover_gaps(result: PlanResult) -> list[Mapping[str, Any]]:
    """The gaps an applied ``recover_plan`` reported (records the peers deleted that could not
    come back), from its last step's result."""
    for outcome in reversed(result.outcomes):
        if outcome.step.action in ("finish", "events") and isinstance(outcome.result, dict):
            return list(outcome.result.get("gaps") or [])
    return []


__all__ = ["recover_gaps", "recover_plan"]
