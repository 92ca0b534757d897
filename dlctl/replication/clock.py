"""The clock base of a log: ``logs/<name>/clock`` in the log's cluster (issue 11).

A location derives the vector timestamps of its local records while reading its log (see
``dlctl.replication.causal``): the version vector before the record, own counter plus one.
A location that lost its log would start counting again from zero and reuse timestamps its
peers have already seen. The clock base is the minimum version vector the log starts from:
readers that start at the beginning of the log (or anywhere without a checkpointed vector)
start from it, so new local records get counters above every one handed out before.
``dlctl dr recover`` raises it — by compare-and-set, never lowering a component — to the
highest counter of the location that any directly connected peer has seen.

A base takes effect from a position (``from``): records before it keep the timestamps they were
always read with (a partly recovered log keeps its surviving records' identity); records at or
after it derive from at least the base. JSON ``{"steps": [{"from": "seq/entry/slot", "vv":
{...}}, ...], "updated": ...}`` (steps in position order); absent = no base.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ..errors import ConflictError, NotFoundError
from ..log.dlsn import DLSN
from ..meta import paths
from ..meta.records import Versioned
from ..meta.store import MetaStore
from ..names import validate_name
from .causal import merge

ClockBase = tuple[tuple[DLSN, dict[str, int]], ...]  # (from, vv) steps in position order


def parse_base(data: bytes, where: str) -> ClockBase:
    try:
        raw = json.loads(data)
        steps = []
        for step in raw["steps"]:
            vv = step["vv"]
            if not isinstance(vv, dict):
                raise ValueError("vv must be an object")
            out = {validate_name("location", k): int(v) for k, v in vv.items()}
            if any(v < 0 for v in out.values()):
                raise ValueError("negative counter")
            steps.append((DLSN.parse(step["from"]), out))
        return tuple(sorted(steps, key=lambda s: s[0]))
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: malformed clock base: {exc}") from None


def _dump(steps: ClockBase, reason: str) -> bytes:
    return json.dumps({"steps": [{"from": str(f), "vv": vv} for f, vv in steps], "reason": reason, "updated": time.time()}, sort_keys=True).encode()


def floor_at(steps: ClockBase, position: DLSN) -> dict[str, int]:
    """The merged base of every step that starts at or before ``position``."""
    out: dict[str, int] = {}
    for start, vv in steps:
        if start <= position:
            out = merge(out, vv)
    return out


class ClockStore:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    def get(self, name: str) -> Versioned[ClockBase]:
        """The log's clock base steps (empty, version -1, when it has none)."""
        path = paths.log_clock(self.cluster, name)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return Versioned((), -1)
        return Versioned(parse_base(data, path), stat.version)

    def steps(self, name: str) -> ClockBase:
        return self.get(name).value

    def raise_to(self, name: str, floor: Mapping[str, int], start: DLSN, reason: str = "") -> ClockBase:
        """Make local records at or after ``start`` count from at least ``floor`` (merged with
        every earlier step; never lowers anything). Idempotent."""
        path = paths.log_clock(self.cluster, name)
        for _ in range(8):
            current = self.get(name)
            already = floor_at(current.value, DLSN(2**62, 0, 0))
            wanted = {k: int(v) for k, v in floor.items() if v > 0}
            if all(already.get(k, 0) >= v for k, v in wanted.items()) and current.version >= 0:
                return current.value
            steps = tuple(sorted((*current.value, (start, merge(already, wanted))), key=lambda s: s[0]))
            try:
                if current.version < 0:
                    self.client.create(path, _dump(steps, reason), acl=self.meta.acl)
                else:
                    self.client.set(path, _dump(steps, reason), version=current.version)
                return steps
            except (NodeExistsError, BadVersionError):
                continue  # raised concurrently: merge again
            except NoNodeError:
                raise NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}") from None
        raise ConflictError(f"aborted: {path} kept changing", hint="retry")

    def clear(self, name: str) -> None:
        try:
            self.client.delete(paths.log_clock(self.cluster, name))
        except NoNodeError:
            pass
