"""Independent references and hand-written nets for the partition tests.

``brute_force_costs`` enumerates every placement of a small net and prices it from the
definition of the serial objective (``placement_reference.serial_costs``), never by the
code under test. ``hand_net_costs`` writes the cost tables ``placer.costs.model`` makes
(``NetCosts``) from short rows, on the CPU + one GPU machine of the default profiles."""
from __future__ import annotations

import numpy as np
from placement_reference import serial_costs


def every_placement(n: int, k: int) -> np.ndarray:
    """[k**n, n]: row r puts op i on device (r // k**i) % k. With two devices (the host
    and one GPU) op i is on the GPU iff bit i of r is set."""
    rows = np.arange(k ** n)
    return (rows[:, None] // k ** np.arange(n)) % k


def brute_force_costs(arr) -> np.ndarray:
    """Serial cost of every placement, in ``every_placement`` order; +inf where an op is
    on a device it may not take (no kernel, a pin) or colocated ops are apart."""
    n = arr.n_ops
    P = every_placement(n, arr.k)
    total = serial_costs(arr, P)
    total[~arr.allowed[np.arange(n), P].all(axis=1)] = np.inf
    for a, b in np.asarray(arr.colocate).reshape(-1, 2).tolist():
        total[P[:, a] != P[:, b]] = np.inf
    return total


def brute_force_best(arr) -> np.ndarray:
    """The cheapest placement (device index per op) by ``brute_force_costs``."""
    return every_placement(arr.n_ops, arr.k)[int(np.argmin(brute_force_costs(arr)))]


def cpu_gpu_machine():
    """The CPU + one GPU machine of the default profiles."""
    from placer.hardware.machine import compose_machine
    from placer.hardware.profiles import default_profiles
    return compose_machine(*default_profiles())


def hand_net_costs(ops, tensors, machine=None):
    """``NetCosts`` from short rows (copy times then come from the machine's links).

    ops: (cpu_s, gpu_s) or (cpu_s, gpu_s, has_gpu_kernel), named op0, op1, ... of type FC;
    tensors: (name, producer, consumers, bytes) with an optional 5th external_output;
    producer -1 is the host, -2 the init net."""
    import pandas as pd

    from placer.costs.model import OP_COLUMNS, NetCosts, TensorTable
    machine = machine or cpu_gpu_machine()
    n = len(ops)
    ops_frame = pd.DataFrame({"index": range(n), "name": [f"op{i}" for i in range(n)], "type": ["FC"] * n,
                              "flops": 0.0, "macs": 0.0, "bytes_read": 0.0, "bytes_written": 0.0,
                              "param_bytes": 0.0, "output_bytes": 0.0, "known": True}, columns=OP_COLUMNS)
    counts = [len(t[2]) for t in tensors]
    table = TensorTable([t[0] for t in tensors], np.array([t[1] for t in tensors], np.int64),
                        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        np.array([c for t in tensors for c in t[2]], np.int64),
                        np.array([t[3] for t in tensors], float),
                        np.array([bool(t[4]) if len(t) > 4 else False for t in tensors]))
    kinds = [d.kind for d in machine.devices]
    kernels = np.array([[kind == "cpu" or (len(o) < 3 or bool(o[2])) for kind in kinds] for o in ops], bool)
    op_s = np.array([[o[0] if kind == "cpu" else o[1] for kind in kinds] for o in ops], float)
    return NetCosts(ops=ops_frame, op_s=op_s.reshape(n, len(kinds)),
                    op_source=np.full((n, len(kinds)), "measured", dtype=object),
                    kernels=kernels.reshape(n, len(kinds)), tensors=table, machine=machine, model=None)
