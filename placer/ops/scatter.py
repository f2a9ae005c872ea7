"""Row scatter and segment sums shared by the sparse gradient and optimizer ops.

Written once against ``xp`` (numpy or cupy) with no Python loop over rows and no
``ufunc.at`` (numpy's ``add.at`` is slow; cupy's ``reduceat`` exists only for add and
loses precision):

- ``segment_sum(xp, values, segment_ids, n_segments)``: per segment, the sum of the rows
  of ``values`` whose id it is. The ids are sorted once (a stable argsort); with
  ``indptr = searchsorted(sorted ids, 0..n_segments)`` the sum is the product of a
  (segments x rows) CSR matrix of ones with ``values`` -- scipy.sparse on numpy,
  cupyx.scipy.sparse (cuSPARSE) on cupy. Each row is read once; empty segments are 0.
- ``scatter_add_rows(xp, table, indices, rows)``: ``table`` with ``rows[i]`` added to row
  ``indices[i]`` (duplicates add up), touching only the distinct looked-up rows: the
  rows are summed per distinct index first, then added with one fancy-index update
  (safe: the indices are distinct by then). A copy of ``table``, or ``table`` itself
  updated in place with ``inplace=True``.
- ``occurrence_rounds(xp, indices)``: positions of ``indices`` grouped by occurrence
  rank (first time an index appears, second time, ...). Caffe2's sparse optimizers
  walk the indices in order, so a row that appears twice is updated twice, the second
  time from the first update's result; applying the rounds one after another gives
  exactly that, each round a vectorised update over distinct rows. The number of
  rounds is the largest multiplicity (1 when the indices are unique).
"""
from __future__ import annotations


def _sparse_module(xp):
    if xp.__name__ == "numpy":
        import scipy.sparse as sparse
    else:
        import cupyx.scipy.sparse as sparse
    return sparse


def stable_argsort(xp, a):
    """Indices that sort the non-negative integers ``a``, equal values kept in input order.

    The sort key is value * n + position: all keys differ, so any sort is stable on it
    (numpy's default argsort is not stable, and cupy's takes no ``kind``). Values are row
    numbers, so value * n stays far below 2^63."""
    n = a.shape[0]
    return xp.argsort(a.astype(xp.int64) * n + xp.arange(n, dtype=xp.int64))


def segment_sum(xp, values, segment_ids, n_segments: int):
    """Sum of the rows of ``values`` per segment id in ``0..n_segments-1``; shape
    ``(n_segments,) + values.shape[1:]``. ``values`` must be float32 or float64."""
    n = segment_ids.shape[0]
    width = 1
    for d in values.shape[1:]:
        width *= d
    flat = values.reshape(n, width)
    ids = segment_ids.astype(xp.int64)
    order = stable_argsort(xp, ids)
    indptr = xp.searchsorted(ids[order], xp.arange(n_segments + 1, dtype=xp.int64), side="left")
    sparse = _sparse_module(xp)
    matrix = sparse.csr_matrix((xp.ones(n, dtype=flat.dtype), order, indptr), shape=(n_segments, n))
    out = xp.asarray(matrix @ flat) if n else xp.zeros((n_segments, flat.shape[1]), dtype=flat.dtype)
    return out.reshape((n_segments,) + tuple(values.shape[1:]))


def distinct_rows(xp, indices):
    """(sorted distinct indices, position of each index among them)."""
    unique, inverse = xp.unique(indices, return_inverse=True)
    return unique, inverse.reshape(-1)


def scatter_add_rows(xp, table, indices, rows, inplace: bool = False):
    """``table`` (a copy, or itself when ``inplace``) with ``rows[i]`` added to
    ``table[indices[i]]``."""
    out = table if inplace else table.copy()
    if indices.shape[0] == 0:
        return out
    unique, inverse = distinct_rows(xp, indices)
    sums = segment_sum(xp, rows.reshape((indices.shape[0],) + tuple(table.shape[1:])),
                       inverse, unique.shape[0])
    out[unique] += sums.astype(out.dtype, copy=False)
    return out


def occurrence_rounds(xp, indices) -> list:
    """Positions of ``indices`` by occurrence rank: round k holds, for every index seen
    more than k times, the position of its (k+1)-th occurrence (in input order)."""
    n = indices.shape[0]
    if n == 0:
        return []
    order = stable_argsort(xp, indices)
    ordered = indices[order]
    starts = xp.searchsorted(ordered, ordered, side="left")
    rank = xp.arange(n) - starts              # occurrence number within equal indices
    top = int(rank.max())
    if top == 0:
        return [xp.arange(n)]
    return [xp.sort(order[rank == k]) for k in range(top + 1)]
