"""A one-line progress bar on stderr: step i of n, elapsed, time left.

Silent when stderr is not a terminal (logs, pipes, tests) or when asked to be quiet, so
that output files and captured logs never carry carriage returns. Redrawn at most ten
times a second, so a loop over thousands of cheap steps pays almost nothing.
"""
from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds % 3600 // 60:02d}"


class Progress:
    """``with Progress(n, "run") as p: ... p.update(i)``; ``enabled`` False makes it a no-op."""

    WIDTH = 24
    INTERVAL_S = 0.1

    def __init__(self, total: int, label: str = "", quiet: bool = False, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = not quiet and total > 0 and bool(isatty())
        self.total, self.label = total, label
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < self.INTERVAL_S and done < self.total:
            return
        self.last = now
        self.stream.write("\r" + self.line(now) + "\x1b[K")
        self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.start
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        left = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        bar = "#" * int(frac * self.WIDTH)
        return (f"{self.label} [{bar:<{self.WIDTH}}] {self.done}/{self.total} "
                f"{_clock(elapsed)} elapsed, {_clock(left)} left")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
