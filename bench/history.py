"""Run records: size and time of archiving logs of 1 000 to 100 000 lines (no I/O).

    python bench/history.py

For each size, a log shaped like an OpenM++ model's (progress lines of ~70 bytes) is turned into
a run record (:func:`proxy.follow.archive.fit`, what the proxy does once per run, in a worker
thread) and read back (:func:`proxy.follow.archive.decode`, once per record and replica, then
kept in a small LRU). Prints the raw and compressed sizes, the lines kept under the default cap
(``history.max_log_bytes``) and the times.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from proxy.config import HistoryConfig
from proxy.follow.archive import RunRecord, decode, fit
from proxy.follow.view import PREFIX


def _record(lines: list[str]) -> RunRecord:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    stamp = "2026_01_01_00_00_00_000"
    return RunRecord(
        *("ompp-riskpaths-1", "uid", "RiskPaths", "_digest_", stamp, stamp, "bench"),
        phase="succeeded",
        status="s",
        reason="",
        created=t,
        submitted=t,
        final_at=t,
        updated=t,
        archived_at=t,
        mpi_np=8,
        workers=8,
        slots=1,
        threads=4,
        not_on_root=True,
        sub_values=8,
        lines=tuple(lines),
    )


def main() -> int:
    cap = HistoryConfig().max_log_bytes
    for n in (1_000, 10_000, 100_000):
        body = [
            f"2026-01-01 00:00:{i % 60:02d}.{i % 1000:03d} member={i % 8} "
            f"Simulation progress={i * 100 // n}% cases={i * 137}"
            for i in range(n)
        ]
        lines = [f"{PREFIX}submitted", *body, f"{PREFIX}2026-01-01 00:01:00 run succeeded: done"]
        view = _record(lines).view()
        t0 = time.perf_counter()
        record, blob = fit(view, view.updated, cap)
        t1 = time.perf_counter()
        decode(blob)
        t2 = time.perf_counter()
        raw = sum(len(x.encode()) + 1 for x in lines)
        print(
            f"{n:>7} lines: {raw:>9} B -> {len(blob):>7} B gzip ({raw / len(blob):4.1f}x), "
            f"{len(record.lines):>6} lines kept ({record.lines_not_kept} not), "
            f"archive {1000 * (t1 - t0):6.1f} ms, read back {1000 * (t2 - t1):5.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
