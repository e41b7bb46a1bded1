"""Disk space claimed at start so that a graceful stop on a full disk can still save
what memory holds (docs/durability.md)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("srtm.broker.disk")

_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class Reserve:
    """Space claimed at start (a preallocated file) and given back at a graceful stop, so
    that the heads saved then still fit on a full disk."""

    NAME = "reserve.dat"

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / self.NAME
        self.size = size
        self.held = 0
        self._next_try = 0.0

    def claim(self, retry: bool = False) -> None:
        """Preallocate the reserve (kept if already there); on failure log it (once, for
        ``retry``: the broker tries again while it runs) and hold none."""
        if self.size <= 0 or self.held:
            return
        if retry and time.monotonic() < self._next_try:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            self._next_try = time.monotonic() + 10.0
            if not retry:
                level = logging.WARNING if exc.errno in _NO_SPACE else logging.ERROR
                log.log(level, "no %d-byte disk reserve at %s (%s): a stop on a full disk "
                        "may not save what memory holds", self.size, self.path, exc)  # fmt: skip
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        if retry:
            log.info("disk reserve of %d bytes claimed at %s", self.size, self.path)
        self.held = self.size

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.held = 0
