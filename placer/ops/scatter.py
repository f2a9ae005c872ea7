"""The order in which the sparse optimizer ops apply repeated indices.

Caffe2's sparse optimizers walk their indices in order, so a row listed twice is updated
twice, the second time from the first update's result. ``checked_rounds`` groups the
positions of the indices by occurrence rank (the first time an index appears, the second
time, ...); applying the rounds one after another, each a vectorised update over distinct
rows, gives exactly the C++ loop's result. There are as many rounds as the largest
multiplicity (one when the indices are unique).

Construction (written once against ``xp``, numpy or cupy, with one host read):
the indices are sorted stably (``segments.stable_argsort``); an entry's occurrence rank
is its sorted position minus the first sorted position of its value (a binary search).
A second stable sort by (rank, position) lists round 0's positions, then round 1's, ...,
each in input order, so round k is a slice of that list. The slice bounds (the count of
ranks below k, for every k), the smallest and the largest index come back to the host in
one read of n + 3 integers (an array, not a Python list): the range check against the
parameter's rows and the rounds' sizes together.
Row sums by index (no order needed) are ``segments.add_rows_at`` and ``segments.sum_by_id``.
"""
from __future__ import annotations

import numpy as np

from placer.errors import InputError
from placer.ops.segments import on_host, stable_argsort


def indices_in_rounds(xp, indices, rows: int, where: str) -> tuple:
    """(flat ``indices``, their rounds), every index checked to lie in 0..rows-1 (an
    InputError naming ``where``, e.g. "op #3 SparseAdagrad", otherwise)."""
    flat = indices.reshape(-1)
    lo, hi, rounds = checked_rounds(xp, flat)
    if flat.size and (lo < 0 or hi >= rows):
        raise InputError(f"{where} index {lo if lo < 0 else hi} is out of range for a parameter of {rows} rows")
    return flat, rounds


def checked_rounds(xp, indices) -> tuple[int, int, list]:
    """(smallest index, largest index, rounds) of the 1-D integer ``indices``: round k
    holds, in input order, the position of the (k+1)-th occurrence of every index listed
    more than k times. Empty indices give (0, -1, [])."""
    n = indices.shape[0]
    if n == 0:
        return 0, -1, []
    order = stable_argsort(xp, indices)
    ordered = indices[order]
    rank = xp.arange(n, dtype=xp.int64) - xp.searchsorted(ordered, ordered, side="left")
    by_rank = xp.argsort(rank * n + order)                  # keys distinct: a stable order
    by_round = order[by_rank]
    bounds = xp.searchsorted(rank[by_rank], xp.arange(n + 1, dtype=xp.int64), side="left")
    probes = xp.stack([indices.min(), indices.max()]).astype(xp.int64)
    read = xp.concatenate([probes, bounds])
    host = read if on_host(xp) else read.get()
    starts = host[2:]                                       # starts[k]: positions of rank < k
    n_rounds = int(np.searchsorted(starts, n, side="left"))
    rounds = [by_round[int(starts[k]):int(starts[k + 1])] for k in range(n_rounds)]
    return int(host[0]), int(host[1]), rounds
