"""The stream hands what its micro-batches freed back to the system (glibc's allocator keeps it)."""

from __future__ import annotations

import pytest

from speed_layer import freed_memory
from speed_layer.freed_memory import trimmer

pytestmark = pytest.mark.skipif(freed_memory._malloc_trim() is None, reason="the C library is not glibc")


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def test_freed_memory_goes_back_at_most_every_interval():
    blocks = [bytearray(4000) for _ in range(50_000)]  # ~200 MB from malloc's heap, not mmap
    kept = blocks[-1]  # the heap's top stays in use: freeing the rest does not shrink it
    del blocks
    held = resident_mb()
    trimmer(every=3600)()  # not due yet
    assert resident_mb() > held - 50
    trimmer(every=0)()
    assert resident_mb() < held - 100
    assert kept
