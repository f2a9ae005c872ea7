"""Reductions over segments of consecutive rows, shared by the op families that need them.

A segment s is the LENGTHS[s] consecutive rows that follow segment s-1; an empty
segment reduces to 0 (Caffe2's convention for sums, means and maxima alike). Every
helper takes 2-D ``rows`` (n, D) and 1-D integer ``lengths`` (S,) summing to n (callers
check that), returns (S, D), and never reads a value back to the host.

How each device does it (the fast primitive of each, chosen by ``on_host``):
- numpy: ``ufunc.reduceat`` over the row offsets, one pass, each segment reduced on its
  own. A zero row appended to ``rows`` makes every offset, n included, a valid index;
  reduceat returns a row for an empty segment (the row at its offset), which is then
  replaced by 0.
- cupy: ``ufunc.at`` (a scatter kernel with atomic adds or maxima) of every row into its
  segment's output row, the segment of each row found by a binary search over the
  segment ends. cupy implements ``reduceat`` only for add, and as a cumulative sum over
  all rows followed by differences of it: in float32 that loses ~1e-4 relative at 10k
  rows and ~1e-2 at 1M rows, so it is not used. cupy's atomics take float32 and float64
  (add also float16, max not): float16 rows are reduced in float32.

Rows grouped by an id in any order instead of by lengths (``sum_by_id``, ``add_rows_at``,
``id_counts``; the sparse gradients and optimizers) follow the same split: a CSR product
on numpy, a scatter-add on cupy, and no host read (see their section below).
"""
from __future__ import annotations


def on_host(xp) -> bool:
    """Whether ``xp`` is numpy (the CPU), where reduceat beats scattered atomics."""
    return getattr(xp, "__name__", "") == "numpy"


def offsets(xp, lengths):
    """int64 [0, L0, L0+L1, ...]: S+1 segment starts, the last one n."""
    return xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(lengths, dtype=xp.int64)])


def segment_ids(xp, lengths, n_rows: int):
    """int64 segment number of each of ``n_rows`` rows: the count of segment ends <= row."""
    ends = xp.cumsum(lengths, dtype=xp.int64)
    return xp.searchsorted(ends, xp.arange(n_rows, dtype=xp.int64), side="right")


def accumulation_dtype(xp, dtype):
    """float16 rows are reduced (and returned) in float32, as Caffe2 does."""
    return xp.float32 if dtype == xp.float16 else dtype


def segment_sum(xp, rows, lengths):
    """Per-segment sum of consecutive ``rows``; 0 for an empty segment."""
    acc = accumulation_dtype(xp, rows.dtype)
    rows = rows.astype(acc, copy=False)
    if on_host(xp):
        return _reduceat(xp, xp.add, rows, lengths)
    out = xp.zeros((lengths.shape[0], rows.shape[1]), dtype=acc)
    if rows.shape[0]:
        xp.add.at(out, segment_ids(xp, lengths, rows.shape[0]), rows)
    return out


def segment_max(xp, rows, lengths):
    """Per-segment maximum of consecutive ``rows``; 0 for an empty segment."""
    acc = accumulation_dtype(xp, rows.dtype)
    rows = rows.astype(acc, copy=False)
    if on_host(xp):
        return _reduceat(xp, xp.maximum, rows, lengths)
    out = xp.full((lengths.shape[0], rows.shape[1]), -xp.inf, dtype=acc)
    if rows.shape[0]:
        xp.maximum.at(out, segment_ids(xp, lengths, rows.shape[0]), rows)
    return xp.where((lengths > 0)[:, None], out, xp.zeros((), dtype=acc))


def _reduceat(xp, ufunc, rows, lengths):
    if lengths.shape[0] == 0:
        return xp.zeros((0, rows.shape[1]), dtype=rows.dtype)
    padded = xp.concatenate([rows, xp.zeros((1, rows.shape[1]), dtype=rows.dtype)])
    reduced = ufunc.reduceat(padded, offsets(xp, lengths), axis=0)[:-1]
    return xp.where((lengths > 0)[:, None], reduced, xp.zeros((), dtype=rows.dtype))


# -- rows grouped by an id instead of by consecutive lengths ---------------------------------
# Ids in any order (a gradient row per looked-up index, a value per sparse position).
# numpy: the ids are sorted once (a stable key) and a (ids x rows) CSR matrix of ones times
# the rows sums each group, reading each row once (scipy.sparse; ``add.at`` is 2-3x
# slower). cupy: a scatter-add (``add.at``) of every row into its id's output row; no
# cuSPARSE product (it syncs, sorts and copies its operands on every call) and no host read.

def stable_argsort(xp, ids):
    """Indices that sort the non-negative integers ``ids``, equal values kept in input
    order. The key value * n + position makes every key distinct, so any sort is stable on
    it (numpy's default argsort is not, and cupy's takes no ``kind``); ids are row numbers,
    so the key stays far below 2^63."""
    n = ids.shape[0]
    return xp.argsort(ids.astype(xp.int64) * n + xp.arange(n, dtype=xp.int64))


def sum_by_id(xp, rows, ids, n_ids: int):
    """(n_ids, D) sums of the 2-D ``rows`` (n, D) per id in ``0..n_ids-1`` (ids checked by the
    caller); 0 for an id no row has. float16 rows are summed (and returned) in float32."""
    acc = accumulation_dtype(xp, rows.dtype)
    rows = rows.astype(acc, copy=False)
    n = ids.shape[0]
    if not on_host(xp):
        out = xp.zeros((n_ids, rows.shape[1]), dtype=acc)
        if n:
            xp.add.at(out, ids, rows)
        return out
    if n == 0:
        return xp.zeros((n_ids, rows.shape[1]), dtype=acc)
    import scipy.sparse   # here, not at the top: most nets never import it

    order = stable_argsort(xp, ids)
    indptr = xp.searchsorted(ids[order], xp.arange(n_ids + 1), side="left")
    matrix = scipy.sparse.csr_array((xp.ones(n, dtype=acc), order, indptr), shape=(n_ids, n))
    return xp.asarray(matrix @ rows)


def add_rows_at(xp, table, ids, rows, inplace: bool = False):
    """A copy of the 2-D ``table`` (``table`` itself when ``inplace``) with ``rows[i]`` added
    to row ``ids[i]`` (repeated ids add up). numpy: the rows are summed per distinct id
    first, then added with one fancy-index update over distinct rows; cupy: one
    scatter-add into the copy."""
    out = table if inplace else table.copy()
    if ids.shape[0] == 0:
        return out
    if not on_host(xp):
        xp.add.at(out, ids, rows.astype(out.dtype, copy=False))
        return out
    distinct, position = xp.unique(ids, return_inverse=True)
    out[distinct] += sum_by_id(xp, rows, position.reshape(-1), distinct.shape[0]).astype(out.dtype, copy=False)
    return out


def id_counts(xp, ids, presorted: bool = False):
    """For each entry of the integer ``ids``, how many entries share its value: two binary
    searches over the sorted ids (no host read, unlike ``bincount`` on cupy)."""
    ordered = ids if presorted else xp.sort(ids)
    return (xp.searchsorted(ordered, ids, side="right") - xp.searchsorted(ordered, ids, side="left"))
