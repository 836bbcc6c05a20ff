"""The proxy's memory stays flat while 256 MiB streams through it, in both directions.

The stand-in oms and the proxy run as subprocesses (as in production: nothing shares the test's
event loop); the test streams a 256 MiB download and a 256 MiB upload through the proxy over
plain sockets, checks both bodies by SHA-256, and asserts that the proxy's peak RSS (VmHWM, reset
after warm-up) stays within 32 MiB of its idle RSS. A proxy that buffered a body would grow by
256 MiB. No timing is asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import _common as c
from standins.oms import pattern_sha256

SIZE = 256 * 1024 * 1024
MAX_GROWTH_KIB = 32 * 1024


@pytest.fixture
def oms_and_proxy(tmp_path: Path) -> Iterator[tuple[c.Server, c.Server]]:
    """The stand-in oms and the proxy in front of it, each a subprocess; both always stopped."""
    oms = c.start_oms(tmp_path, max_seconds=300)
    try:
        proxy = c.start_proxy(oms.url, tmp_path)
        try:
            yield oms, proxy
        finally:
            proxy.stop()
    finally:
        oms.stop()


def test_256_mib_download_and_upload_keep_proxy_rss_flat(
    oms_and_proxy: tuple[c.Server, c.Server],
) -> None:
    _, proxy = oms_and_proxy
    expected = pattern_sha256(SIZE)

    # Warm up: the code paths, the connection pool and the first buffers exist from here on.
    small = c.download(proxy.url, "/test/download/1048576", sha=True, timeout=30)
    assert small.sha256 == pattern_sha256(1 << 20)
    assert c.upload(proxy.url, "/test/upload", 1 << 20, timeout=30).sha256 == small.sha256
    idle_kib = c.status_kib(proxy.pid, "VmRSS")

    with c.PeakRss(proxy.pid) as peak:
        down = c.download(proxy.url, f"/test/download/{SIZE}", sha=True, timeout=120)
        up = c.upload(proxy.url, "/test/upload", SIZE, timeout=120)

    assert (down.status, down.bytes, down.sha256) == (200, SIZE, expected)
    assert (up.status, up.bytes, up.sha256) == (200, SIZE, expected)  # as oms received it
    growth_kib = peak.peak_kib - idle_kib
    assert growth_kib < MAX_GROWTH_KIB, (
        f"proxy RSS grew by {growth_kib / 1024:.1f} MiB while streaming "
        f"(idle {idle_kib / 1024:.1f} MiB, peak {peak.peak_kib / 1024:.1f} MiB)"
    )
