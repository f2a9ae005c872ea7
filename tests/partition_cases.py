"""Independent references for the partition tests: brute-force enumeration of every
placement of a small net, written from the definition of the serial objective only."""
from __future__ import annotations


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


def brute_force_memory(arr, gpu_row) -> float:
    """GPU bytes of one placement, step by step from the lifetime rules in DESIGN.md:
    parameters read on the GPU for the whole run; a blob made on the GPU from its producer
    to its last GPU reader; a blob copied in from its first to its last GPU reader;
    unread written bytes during their op only."""
    n = arr.n_ops
    params = 0.0
    steps = [0.0] * n
    made_bytes = [0.0] * n
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        cons = [int(c) for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]]
        on = [c for c in cons if gpu_row[c]]
        b = float(arr.t_bytes[t])
        if p == -2:
            params += b if on else 0.0
            continue
        if p >= 0:
            made_bytes[p] += b
        if p >= 0 and gpu_row[p]:
            end = max([p] + on)
            if arr.t_ext_out[t] and not arr.outputs_on_host:
                end = n - 1
            span = range(p, end + 1)
        elif on:
            span = range(min(on), max(on) + 1)
        else:
            span = range(0)
        for s in span:
            steps[s] += b
    for i in range(n):
        if gpu_row[i]:
            steps[i] += max(float(arr.output_bytes[i]) - made_bytes[i], 0.0)
    return params + max(steps, default=0.0)


def hand_net(ops, tensors, outputs_on_host=True):
    """NetCosts-shaped tables from short rows.

    ops: (cpu_s, gpu_s) or (cpu_s, gpu_s, gpu_kernel); tensors: (name, producer,
    consumers, h2d_s, d2h_s) with optional 6th ext_output and 7th bytes."""
    import pandas as pd
    from placer.partition.synthetic import SyntheticNetCosts
    n = len(ops)
    op_rows = pd.DataFrame({
        "index": range(n), "name": [f"op{i}" for i in range(n)], "type": ["FC"] * n,
        "cpu_s": [o[0] for o in ops], "gpu_s": [o[1] for o in ops],
        "cpu_source": "measured", "gpu_source": "measured", "flops": 0.0, "macs": 0.0,
        "bytes_read": 0.0, "bytes_written": 0.0, "param_bytes": 0.0, "output_bytes": 0.0,
        "gpu_kernel": [o[2] if len(o) > 2 else True for o in ops], "known": True})
    t_rows = pd.DataFrame({
        "name": [t[0] for t in tensors], "producer": [t[1] for t in tensors],
        "consumers": [list(t[2]) for t in tensors], "bytes": [t[6] if len(t) > 6 else 1e6 for t in tensors],
        "h2d_s": [t[3] for t in tensors], "d2h_s": [t[4] for t in tensors],
        "external_output": [t[5] if len(t) > 5 else False for t in tensors]})
    return SyntheticNetCosts(op_rows, t_rows)
