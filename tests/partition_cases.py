"""Independent references for the partition tests: brute-force enumeration of every
placement of a small net, written from the definition of the serial objective only."""
from __future__ import annotations

import itertools

import numpy as np


def brute_force_costs(arr) -> np.ndarray:
    """Serial cost of every placement (row r: op i on the GPU iff bit i of r is set);
    +inf where a pin or a colocation is broken."""
    n = arr.n_ops
    rows = np.arange(2 ** n)
    gpu = ((rows[:, None] >> np.arange(n)) & 1).astype(bool)
    total = np.where(gpu, arr.gpu_s, arr.cpu_s).sum(axis=1)
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        if p == -2:
            continue
        cons = [int(c) for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]]
        made_gpu = gpu[:, p] if p >= 0 else np.zeros(len(rows), bool)
        any_gpu = gpu[:, cons].any(axis=1) if cons else np.zeros(len(rows), bool)
        any_cpu = (~gpu[:, cons]).any(axis=1) if cons else np.zeros(len(rows), bool)
        if arr.outputs_on_host and arr.t_ext_out[t]:
            any_cpu = np.ones(len(rows), bool)
        total = total + np.where(~made_gpu & any_gpu, arr.t_h2d[t], 0.0)
        total = total + np.where(made_gpu & any_cpu, arr.t_d2h[t], 0.0)
    for i in range(n):
        if arr.pin[i] == 0:
            total[gpu[:, i]] = np.inf
        elif arr.pin[i] == 1:
            total[~gpu[:, i]] = np.inf
    for a, b in arr.colocate:
        total[gpu[:, a] != gpu[:, b]] = np.inf
    return total
