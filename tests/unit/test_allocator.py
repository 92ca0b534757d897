"""dlctl.allocator: large buffers reuse warm heap pages instead of fresh mappings."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import resource, sys
from dlctl.allocator import keep_large_buffers
if sys.argv[1] == "tuned":
    assert keep_large_buffers()
chunk = b"x" * (1 << 20)
def churn():
    for _ in range(10):
        # A copy's pattern: a window of 2 MiB buffers alive at once, then all freed.
        window = [b"".join([chunk, chunk]) for _ in range(8)]
        del window
churn()  # warm up: the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_a_tuned_process_reuses_the_pages_of_freed_large_buffers():
    # 10 windows of 16 MiB are 40,960 pages: untuned, glibc gives each freed window back to the
    # kernel and the next one is faulted in afresh; tuned, it reuses the pages the first touched.
    untuned, tuned = _faults("default"), _faults("tuned")
    assert untuned > 20_000
    assert tuned < 1_000
