"""Per-op time samples of many runs, in bounded memory.

``placer run --iterations N`` times every op N times. Keeping every sample grew a 2-op
net's process from 131 to 383 MB in 40 s; so each op keeps running figures instead:

- the count, mean and sum of squared deviations (Welford's update: exact in one pass,
  no cancellation), the minimum and the maximum;
- a uniform sample of at most ``RESERVOIR_SAMPLES`` times (reservoir sampling, Vitter's
  algorithm R, with a fixed seed so that a run's record does not depend on the process):
  the median and the quartiles are read from it.

Up to ``RESERVOIR_SAMPLES`` runs the reservoir holds every sample in the order they came,
so a short run's median, quartiles and ``samples_s`` are exactly those of all its samples.
Past it, a quantile of 256 uniform samples has a standard error of about 0.03 in rank
(sqrt(p(1 - p) / 256) at the median), well inside the run-to-run spread of a shared host.
"""
from __future__ import annotations

import math
import random
from array import array

# Samples kept per op: 2 KiB of float64, so 10,000 ops keep 20 MiB whatever N is.
RESERVOIR_SAMPLES = 256
_SEED = 0x5EED


class RunningTimes:
    """Times of one op over the runs: ``add`` each; read ``count``, ``mean``, ``std``,
    ``minimum``, ``maximum``, ``samples`` (the reservoir) and ``median``."""

    __slots__ = ("count", "mean", "m2", "minimum", "maximum", "_kept", "_rng")

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.minimum, self.maximum = math.inf, -math.inf
        self._kept = array("d")
        self._rng: random.Random | None = None

    def add(self, seconds: float) -> None:
        self.count += 1
        delta = seconds - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (seconds - self.mean)
        self.minimum, self.maximum = min(self.minimum, seconds), max(self.maximum, seconds)
        if len(self._kept) < RESERVOIR_SAMPLES:
            self._kept.append(seconds)
            return
        if self._rng is None:
            self._rng = random.Random(_SEED)
        slot = self._rng.randrange(self.count)  # keep the new sample with chance K / count
        if slot < RESERVOIR_SAMPLES:
            self._kept[slot] = seconds

    def clear(self) -> None:
        self.__init__()

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1 in the denominator); 0 below two samples."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    @property
    def samples(self) -> tuple[float, ...]:
        return tuple(self._kept)

    @property
    def median(self) -> float:
        """Median of the reservoir (of every sample up to ``RESERVOIR_SAMPLES``); 0 if none."""
        kept = sorted(self._kept)
        n = len(kept)
        if not n:
            return 0.0
        return kept[n // 2] if n % 2 else (kept[n // 2 - 1] + kept[n // 2]) / 2

    def summary(self) -> dict:
        """The figures a RunRecord's op keeps beside its samples (``types.OpRun``)."""
        empty = self.count == 0
        return {"count": self.count, "mean_s": self.mean, "std_s": self.std,
                "min_s": 0.0 if empty else self.minimum, "max_s": 0.0 if empty else self.maximum}


def running(samples) -> RunningTimes:
    """A RunningTimes over ``samples`` (a record read back, a cluster worker's steps)."""
    times = RunningTimes()
    for s in samples:
        times.add(float(s))
    return times
