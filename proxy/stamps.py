"""oms time stamps and file-name cleaning (ompp/helper in openmpp/go, re-implemented).

Pure functions; the clock is always passed in. oms writes its stamps in the *local* time of
the server (Go ``time.Now()``); these functions format the wall-clock fields of the datetime
they are given, so pass local time (``datetime.now()``) to match oms.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

# Characters oms's helper.CleanFileName / CleanFilePath replace with '_'.
INVALID_FILE_PATH_CHARS = "\"'`:*?><|$}{@&^;%"
INVALID_FILE_NAME_CHARS = INVALID_FILE_PATH_CHARS + "/\\"

_NAME_TABLE = str.maketrans({c: "_" for c in INVALID_FILE_NAME_CHARS})
_PATH_TABLE = str.maketrans({c: "_" for c in INVALID_FILE_PATH_CHARS})
_STAMP = re.compile(r"[0-9]{4}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{3}")


def make_stamp(dt: datetime) -> str:
    """``YYYY_MM_DD_hh_mm_ss_SSS`` (oms ``helper.MakeTimeStamp``): ``2022_07_08_23_03_27_555``."""
    return (
        f"{dt.year:04d}_{dt.month:02d}_{dt.day:02d}_"
        f"{dt.hour:02d}_{dt.minute:02d}_{dt.second:02d}_{dt.microsecond // 1000:03d}"
    )


def make_datetime(dt: datetime) -> str:
    """``YYYY-MM-DD hh:mm:ss.SSS`` (oms ``helper.MakeDateTime``, the DB ``update_dt`` format)."""
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d} "
        f"{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{dt.microsecond // 1000:03d}"
    )


def is_stamp(s: str) -> bool:
    """True for an underscore time stamp as made by :func:`make_stamp`."""
    return _STAMP.fullmatch(s) is not None


def clean_file_name(s: str) -> str:
    """oms ``helper.CleanFileName``: replace ``"'`:*?><|$}{@&^;%/\\`` with ``_``."""
    return s.translate(_NAME_TABLE)


def clean_file_path(s: str) -> str:
    """oms ``helper.CleanFilePath``: like :func:`clean_file_name` but keeps ``/`` and ``\\``."""
    return s.translate(_PATH_TABLE)


def local_now() -> datetime:
    """The local wall-clock time, as oms uses for its stamps."""
    return datetime.now()  # oms stamps are local, naive time by design


class StampSource:
    """Hands out time stamps that are unique within this process.

    Like oms's ``getNewTimeStamp``: if the time gives a stamp equal to (or, after a clock step
    back, earlier than) the last one handed out, it is advanced to 1 ms past that one (oms
    sleeps and retries instead; either way each new stamp is later than the one before).
    """

    def __init__(self, clock: Callable[[], datetime] = local_now) -> None:
        self._clock = clock
        self._last: datetime | None = None
        self._lock = threading.Lock()

    def next_datetime(self, now: datetime | None = None) -> datetime:
        """``now`` (default: the clock) at millisecond resolution, made later than the last."""
        if now is None:
            now = self._clock()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        with self._lock:
            last = self._last
            if last is not None and _naive(now) <= _naive(last):
                now = last + timedelta(milliseconds=1)
            self._last = now
        return now

    def next(self, now: datetime | None = None) -> str:
        """A new stamp (:func:`make_stamp` of :meth:`next_datetime`)."""
        return make_stamp(self.next_datetime(now))


def _naive(dt: datetime) -> datetime:
    """Wall-clock fields only: stamps show only those."""
    return dt.replace(tzinfo=None)
