"""Random layered DAG nets with random costs, for tests and benchmarks.

``random_arrays(n, seed)`` builds ``CostArrays`` directly (vectorised: a million ops in a
second or two); ``random_net_costs`` gives the same net as ``NetCosts``-shaped tables
(``.ops`` and ``.tensors`` DataFrames) for ``placer.graph.build_cost_graph``.

Shape: op i reads 1-3 blobs made by the ``window`` ops before it (so readers fan out),
some ops also read a host-fed input or a parameter; every op makes one blob; the
blobs nobody reads are external outputs, or scratch bytes when ``drop_unread``.
Costs: CPU times log-normal around ``op_s``, GPU speed-ups log-normal around 4x (some
below 1), copies = 10 us + bytes / 12 GB/s with bytes log-normal around ``tensor_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from placer.partition.problem import PIN_CPU, PIN_NONE, CostArrays


@dataclass
class SyntheticNetCosts:
    ops: pd.DataFrame
    tensors: pd.DataFrame


def random_arrays(n: int, seed: int = 0, window: int = 8, op_s: float = 1e-4,
                  tensor_bytes: float = 1e6, no_kernel: float = 0.03,
                  param_bytes: float = 4e6, outputs_on_host: bool = True) -> CostArrays:
    rng = np.random.default_rng(seed)
    cpu = op_s * rng.lognormal(0, 1.2, n)
    gpu = cpu / rng.lognormal(np.log(4), 1.2, n) + 5e-6
    pin = np.where(rng.random(n) < no_kernel, PIN_CPU, PIN_NONE).astype(np.int8)
    # reads among the previous `window` ops
    k = rng.integers(1, 4, n)
    k[0] = 0
    reader = np.repeat(np.arange(n), k)
    back = rng.integers(1, window + 1, len(reader))
    src = np.maximum(reader - back, 0)
    ok = src < reader
    pairs = np.unique(src[ok] * n + reader[ok])
    src, reader = pairs // n, pairs % n
    # host inputs (read by ~2% of ops) and parameters (read by ~1/3 of ops)
    n_in = max(1, n // 50)
    in_readers = np.sort(rng.integers(0, n, n_in))
    n_par = max(1, n // 3)
    par_readers = rng.integers(0, n, n_par)
    # tensors: op outputs 0..n-1, inputs n.., params after
    t_prod = np.concatenate([np.arange(n), np.full(n_in, -1), np.full(n_par, -2)])
    e_t = np.concatenate([src, n + np.arange(n_in), n + n_in + np.arange(n_par)])
    e_c = np.concatenate([reader, in_readers, par_readers])
    order = np.lexsort((e_c, e_t))
    e_t, e_c = e_t[order], e_c[order]
    T = len(t_prod)
    count = np.bincount(e_t, minlength=T)
    ext = (count == 0) & (t_prod >= 0)
    nbytes = tensor_bytes * rng.lognormal(0, 1.5, T)
    nbytes[n + n_in:] = param_bytes * rng.lognormal(0, 1.5, n_par)
    ptr = np.zeros(T + 1, np.int64)
    ptr[1:] = np.cumsum(count)
    out_bytes = nbytes[:n].copy()
    pbytes = np.bincount(par_readers, weights=nbytes[n + n_in:], minlength=n)
    return CostArrays(
        cpu_s=cpu, gpu_s=gpu, pin=pin, param_bytes=pbytes, output_bytes=out_bytes,
        t_producer=t_prod.astype(np.int64), t_ptr=ptr, t_cons=e_c.astype(np.int64),
        t_bytes=nbytes, t_h2d=1e-5 + nbytes / 12e9, t_d2h=1e-5 + nbytes / 13e9,
        t_ext_out=ext, outputs_on_host=outputs_on_host,
        pin_reason=["pinned: no GPU kernel" if p == PIN_CPU else "" for p in pin.tolist()])


def to_net_costs(arr: CostArrays) -> SyntheticNetCosts:
    """The NetCosts-shaped tables of some arrays (the contract ``placer.costs`` writes)."""
    n = arr.n_ops
    ops = pd.DataFrame({
        "index": np.arange(n), "name": [f"op{i}" for i in range(n)],
        "type": ["FC"] * n, "cpu_s": arr.cpu_s, "gpu_s": arr.gpu_s,
        "cpu_source": "roofline", "gpu_source": "roofline",
        "flops": 0.0, "macs": 0.0, "bytes_read": 0.0, "bytes_written": arr.output_bytes,
        "param_bytes": arr.param_bytes, "output_bytes": arr.output_bytes,
        "gpu_kernel": arr.pin != PIN_CPU, "known": True})
    names = [_tname(int(p), t) for t, p in enumerate(arr.t_producer.tolist())]
    tensors = pd.DataFrame({
        "name": names, "producer": arr.t_producer,
        "consumers": [arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]].tolist()
                      for t in range(arr.n_tensors)],
        "bytes": arr.t_bytes, "h2d_s": arr.t_h2d, "d2h_s": arr.t_d2h,
        "external_output": arr.t_ext_out})
    return SyntheticNetCosts(ops, tensors)


def _tname(producer: int, t: int) -> str:
    return {-1: f"data{t}", -2: f"w{t}"}.get(producer, f"x{t}")


def random_small(n: int, rng: np.random.Generator) -> CostArrays:
    """A small net whose copies cost about as much as its ops (so cuts are not trivial)."""
    arr = random_arrays(n, seed=int(rng.integers(2**31)), window=int(rng.integers(1, 5)),
                        op_s=1e-4, tensor_bytes=float(rng.choice([1e5, 1e6, 4e6])),
                        no_kernel=0.1, outputs_on_host=bool(rng.random() < 0.7))
    return arr
