"""Random layered DAG nets with random costs over k devices, for tests and benchmarks.

``random_arrays(n, seed, gpus=1)`` builds ``CostArrays`` directly (vectorised: a million
ops in a second or two) for a machine of the host CPU and ``gpus`` GPUs.
``to_net_costs(arr)`` writes the same net as the cost tables ``placer.costs.model`` makes
(``NetCosts`` on ``synthetic_machine``, whose links price every copy as the arrays do),
so that the cost graph can be built from them as the planner builds it.

Shape: op i reads 1-3 blobs made by the ``window`` ops before it (so readers fan out),
some ops also read a host-fed input or a parameter; every op makes one blob; the
blobs nobody reads are external outputs.
Costs: CPU times log-normal around ``op_s``, GPU speed-ups log-normal around 4x (some
below 1; with ``hetero`` each GPU is also 1-3x slower than the fastest); copies
host -> GPU 10 us + bytes / 12 GB/s, GPU -> host 10 us + bytes / 13 GB/s, and between
GPUs (``peer``): "nvlink" 10 us + bytes / 40 GB/s for every pair, "staged" through the
host (D2H + H2D), or "mixed" (pairs with an odd index sum on NVLink, the others staged:
the non-uniform links that make expansion moves truncate terms).
"""
from __future__ import annotations

import numpy as np

from placer.costs.arrays import CostArrays
from placer.costs.model import OP_COLUMNS, NetCosts, TensorTable
from placer.hardware.device_profile import DeviceProfile, LinkCurve
from placer.hardware.machine import build_machine

H2D_BPS, D2H_BPS, PEER_BPS, LATENCY_S = 12e9, 13e9, 40e9, 1e-5


def random_arrays(n: int, seed: int = 0, window: int = 8, op_s: float = 1e-4,
                  tensor_bytes: float = 1e6, no_kernel: float = 0.03,
                  param_bytes: float = 4e6, outputs_on_host: bool = True, gpus: int = 1,
                  peer: str = "mixed", hetero: bool = False) -> CostArrays:
    rng = np.random.default_rng(seed)
    k = gpus + 1
    cpu = op_s * rng.lognormal(0, 1.2, n)
    gpu = cpu / rng.lognormal(np.log(4), 1.2, n) + 5e-6
    speed = rng.uniform(1.0, 3.0, gpus) if hetero else np.ones(gpus)
    if hetero:
        speed[0] = 1.0
    op = np.column_stack([cpu] + [gpu * s for s in speed])
    allowed = np.ones((n, k), bool)
    cpu_only = rng.random(n) < no_kernel
    allowed[cpu_only, 1:] = False
    # reads among the previous `window` ops
    reads = rng.integers(1, 4, n)
    reads[0] = 0
    reader = np.repeat(np.arange(n), reads)
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
    pbytes = np.bincount(par_readers, weights=nbytes[n + n_in:], minlength=n)
    link_class, class_s, lanes, routes = _links(k, peer, nbytes)
    return CostArrays(
        op_s=op, allowed=allowed, param_bytes=pbytes, output_bytes=nbytes[:n].copy(),
        t_producer=t_prod.astype(np.int64), t_ptr=ptr, t_cons=e_c.astype(np.int64),
        t_bytes=nbytes, t_ext_out=ext, link_class=link_class, class_s=class_s,
        lanes=lanes, routes=routes,
        devices=("cpu",) + tuple(f"cuda:{g}" for g in range(gpus)),
        device_kinds=("cpu",) + ("gpu",) * gpus, outputs_on_host=outputs_on_host,
        pin_reason=["pinned: no GPU kernel" if c else "" for c in cpu_only.tolist()])


def _fast_peer(a: int, b: int, peer: str) -> bool:
    """Whether devices a and b (GPUs) copy over the NVLink-like class, else staged."""
    return {"nvlink": True, "staged": False}.get(peer, (a + b) % 2 == 1)


def _links(k: int, peer: str, nbytes: np.ndarray):
    """Link classes (0 host -> GPU, 1 GPU -> host, 2 NVLink-like, 3 staged), copy lanes
    (each GPU's PCIe lanes per direction, one lane per NVLink pair and direction) and
    routes (a staged copy runs the source's D2H lane, then the destination's H2D lane)."""
    h2d = LATENCY_S + nbytes / H2D_BPS
    d2h = LATENCY_S + nbytes / D2H_BPS
    classes = np.stack([h2d, d2h, LATENCY_S + nbytes / PEER_BPS, h2d + d2h])
    lc = np.full((k, k), -1, np.int64)
    lanes: list[str] = []

    def lane(name: str) -> int:
        lanes.append(name)
        return len(lanes) - 1
    routes = {}
    for g in range(1, k):
        lc[0, g], lc[g, 0] = 0, 1
        routes[(0, g)] = ((lane(f"pcie{g}:h2d"), 0),)
        routes[(g, 0)] = ((lane(f"pcie{g}:d2h"), 1),)
    for a in range(1, k):
        for b in range(1, k):
            if a != b:
                fast = _fast_peer(a, b, peer)
                lc[a, b] = 2 if fast else 3
                routes[(a, b)] = (((lane(f"peer{a}-{b}"), 2),) if fast
                                  else routes[(a, 0)] + routes[(0, b)])
    return lc, classes, tuple(lanes), routes


def random_small(n: int, rng: np.random.Generator, gpus: int = 1, peer: str = "mixed",
                 hetero: bool = False) -> CostArrays:
    """A small net whose copies cost about as much as its ops (so cuts are not trivial)."""
    return random_arrays(n, seed=int(rng.integers(2**31)), window=int(rng.integers(1, 5)),
                         op_s=1e-4, tensor_bytes=float(rng.choice([1e5, 1e6, 4e6])),
                         no_kernel=0.1, outputs_on_host=bool(rng.random() < 0.7), gpus=gpus,
                         peer=peer, hetero=hetero)


# ------------------------------------------------------------------ as cost tables

def synthetic_machine(gpus: int = 1, peer: str = "mixed"):
    """The machine ``random_arrays(..., gpus, peer)`` prices copies on: GPUs whose PCIe
    curves are ``LATENCY_S + bytes / H2D_BPS`` (``D2H_BPS`` back), pairs on the fast
    peer class joined by a ``LATENCY_S + bytes / PEER_BPS`` curve, the others staged
    through the host. Op times come from the arrays, so the profiles carry no op figures."""
    def profile(kind: str, link: dict) -> DeviceProfile:
        return DeviceProfile(kind=kind, name=f"synthetic {kind}", source={"kind": "synthetic"},
                             peak_flops={"float32": 1e12}, memory_bandwidth_bytes_per_s=1e11,
                             memory_capacity_bytes=float("inf"), launch_overhead_s=LATENCY_S, link=link)
    gpu = profile("gpu", {"h2d": {"pinned": LinkCurve(LATENCY_S, H2D_BPS)},
                          "d2h": {"pinned": LinkCurve(LATENCY_S, D2H_BPS)}})
    curves = [{"src": a, "dst": b, "latency_s": LATENCY_S, "bytes_per_s": PEER_BPS}
              for a in range(gpus) for b in range(gpus) if a != b and _fast_peer(a + 1, b + 1, peer)]
    return build_machine(f"synthetic {gpus} GPU(s), {peer} peers", profile("cpu", {}), [gpu] * gpus,
                         peer_default="staged", peer_curves=curves)


def to_net_costs(arr: CostArrays, peer: str = "mixed"):
    """The ``NetCosts`` of arrays made by ``random_arrays`` with this ``peer``: op names
    ``op<i>`` of type FC, op times as given (source "synthetic"), a kernel on every device
    the op is allowed on, the tensor table as it is, and ``synthetic_machine`` (checked to
    price every copy as ``arr`` does; ValueError if ``peer`` is not the one used).
    ``model`` is None: nothing was priced by a cost model."""
    import pandas as pd
    n, k = arr.op_s.shape
    machine = synthetic_machine(k - 1, peer)
    every = np.arange(arr.n_tensors)
    for a in range(k):
        for b in range(k):
            if a != b and not np.allclose(machine.copy_time(arr.t_bytes, a, b), arr.copy_s(every, a, b),
                                          rtol=1e-12, atol=0):
                raise ValueError(f"copies {arr.devices[a]} -> {arr.devices[b]} are not priced as on "
                                 f"synthetic_machine({k - 1}, {peer!r})")
    ops = pd.DataFrame({"index": np.arange(n), "name": arr.names or [f"op{i}" for i in range(n)],
                        "type": arr.types or ["FC"] * n, "flops": 0.0, "macs": 0.0, "bytes_read": 0.0,
                        "bytes_written": arr.output_bytes, "param_bytes": arr.param_bytes,
                        "output_bytes": arr.output_bytes, "known": True}, columns=OP_COLUMNS)
    names = arr.t_names or [_tensor_name(int(p), t) for t, p in enumerate(arr.t_producer.tolist())]
    tensors = TensorTable(list(names), arr.t_producer.copy(), arr.t_ptr.copy(), arr.t_cons.copy(),
                          arr.t_bytes.copy(), arr.t_ext_out.copy())
    return NetCosts(ops=ops, op_s=arr.op_s.copy(), op_source=np.full((n, k), "synthetic", dtype=object),
                    kernels=arr.allowed.copy(), tensors=tensors, machine=machine, model=None)


def _tensor_name(producer: int, t: int) -> str:
    return {-1: f"data{t}", -2: f"w{t}"}.get(producer, f"x{t}")
