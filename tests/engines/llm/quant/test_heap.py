"""``release_freed_memory``: freed heap memory goes back to the system (glibc), which is what keeps the peak
resident size of a model load near its live weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sluice.engines.llm.quant.heap import release_freed_memory


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident size from /proc")
def test_freed_temporaries_are_returned() -> None:
    # freeing one large mmapped block raises glibc's mmap threshold, so the 1 MiB blocks below come from the
    # heap, as a converter's temporaries do; keeping every fourth alive fragments it
    large = torch.ones(16 << 18)  # 16 MiB of float32
    del large
    blocks = [torch.ones(1 << 18) for _ in range(256)]  # 256 x 1 MiB, touched
    kept = blocks[::4]
    del blocks
    before = _rss_anon_kib()
    if not release_freed_memory():
        pytest.skip("not glibc: there is no allocator call to make")
    released_mib = (before - _rss_anon_kib()) / 1024
    assert released_mib > 100, f"only {released_mib:.0f} MiB of the 192 MiB freed went back"
    assert all(float(b[0]) == 1.0 for b in kept)  # what is alive is untouched
