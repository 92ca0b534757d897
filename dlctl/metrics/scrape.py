"""Fetch an agent's ``/metrics`` and parse it into one flat snapshot of samples.

The agent publishes where it serves them in its availability record (``metrics``: host:port,
absent when ``[metrics] listen = "off"``). A snapshot maps (sample name, sorted labels) to a
value; histograms appear as their ``_bucket``/``_count``/``_sum`` samples, as on the wire.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ..errors import DlctlError

Labels = tuple[tuple[str, str], ...]

MAX_BODY = 16 << 20  # an agent's exposition is a few hundred KiB even with many logs and streams


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic() when the answer arrived
    samples: Mapping[tuple[str, Labels], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, _key(labels)))

    def series(self, name: str) -> dict[Labels, float]:
        """Every sample called ``name``, by its labels."""
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def total(self, name: str) -> float:
        return sum(self.series(name).values())


def _key(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def parse(text: str, at: float | None = None) -> Snapshot:
    """ValueError naming the problem for text that is not the Prometheus exposition format."""
    samples: dict[tuple[str, Labels], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, _key(sample.labels))] = float(sample.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not the Prometheus text format: {exc}") from None
    return Snapshot(time.monotonic() if at is None else at, samples)


def fetch(address: str, timeout: float = 3.0) -> Snapshot:
    """Scrape ``http://ADDRESS/metrics``. DlctlError naming the address when it does not answer
    or answers something else."""
    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - http to an address the agent published
            body = answer.read(MAX_BODY + 1)
    except (OSError, urllib.error.URLError) as exc:
        raise DlctlError(f"metrics at {address}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_BODY:
        raise DlctlError(f"metrics at {address}: answer larger than {MAX_BODY} bytes")
    try:
        return parse(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DlctlError(f"metrics at {address}: {exc}") from None


def addresses(available: Mapping[str, Mapping]) -> dict[str, str]:
    """node id -> metrics address, from the availability records (agents with metrics on)."""
    return {node: str(info["metrics"]) for node, info in available.items() if info.get("metrics")}

