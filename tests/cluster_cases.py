"""Nets and clusters for the cluster tests (tests/test_cluster*.py).

- ``tiny_cluster``: two hosts, each a CPU and ``gpus`` GPUs, over a 10 GbE-like network;
- ``chain_net``: a chain of FC layers (for pipeline splits that do not fit one host);
- ``dp_linear``: the data-parallel step of a linear least-squares model over two hosts,
  one replica per host, written as a placed net (node_name on every op) the way Caffe2's
  data_parallel_model writes one: per-replica forward and gradient, one all-reduce of the
  gradients across hosts (``NCCLAllreduce`` in place on GPUs, or Gloo's ``Allreduce``
  over a common world on CPUs), then each replica's SGD update in place;
- ``sgd_reference``: the same training on the whole batch in numpy (the independent oracle);
- ``assert_equal_up_to_summation_order``: outputs of one net computed in two processes.
"""
from __future__ import annotations

import numpy as np

from placer.hardware.cluster import Network, build_cluster
from placer.formats import caffe2_pb as pb
from placer.hardware.machine import compose_machine
from placer.hardware.profiles import load_device_profile
from placer.types import TensorType

TEN_GBE = Network("10gbe", 1.17e9, 5e-5, False, "test figures")


def tiny_cluster(gpus: int = 1, network: Network = TEN_GBE, hosts=("h0", "h1")):
    cpu = load_device_profile("host-ci-2core", "cpu")
    gpu = load_device_profile("t4-pcie3", "gpu")
    return build_cluster("tiny", [(h, compose_machine(cpu, gpu, gpus)) for h in hosts], network)


def _op(kind, inputs, outputs, where, **args):
    op = pb.OperatorDef(type=kind, input=list(inputs), output=list(outputs))
    host, _, local = where.partition("/")
    op.device_option.node_name = host
    if local != "cpu":
        op.device_option.device_type = pb.PROTO_CUDA
        op.device_option.device_id = int(local.partition(":")[2])
    for key, value in args.items():
        if isinstance(value, float):
            op.arg.add(name=key, f=value)
        elif isinstance(value, (list, tuple)):
            if value and isinstance(value[0], float):
                op.arg.add(name=key, floats=list(value))
            else:
                op.arg.add(name=key, ints=list(value))
        else:
            op.arg.add(name=key, i=int(value))
    return op


def dp_linear(devices=("h0/cuda:0", "h1/cuda:0"), batch: int = 8, n_in: int = 6, n_out: int = 3,
              lr: float = 0.1, seed: int = 0):
    """(predict, init, inputs {name: array}, W0, types) of the data-parallel step (module docstring)."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((n_out, n_in)).astype(np.float32)
    half = batch // len(devices)
    gpu = not devices[0].endswith("/cpu")
    init, predict = pb.NetDef(name="dp_init"), pb.NetDef(name="dp")
    feed = "h0/cpu"
    if not gpu:
        init.op.append(_op("CreateCommonWorld", [], ["dp_cw"], feed, size=1, rank=0))
    inputs, types = {}, {}
    for r, dev in enumerate(devices):
        init.op.append(_op("GivenTensorFill", [], [f"r{r}/W"], dev, shape=[n_out, n_in],
                           values=[float(v) for v in w0.ravel()]))
        for name, cols in (("X", n_in), ("T", n_out)):
            blob = f"r{r}/{name}"
            inputs[blob] = rng.standard_normal((half, cols)).astype(np.float32)
            types[blob] = TensorType((half, cols), "float32")
            predict.external_input.append(blob)
            if dev == feed:
                predict.op.append(_op("Alias", [blob], [f"{blob}_d"], dev))
            else:
                across = dev.partition("/")[0] != feed.partition("/")[0]
                predict.op.append(_op("Copy" if across or not gpu else "CopyCPUToGPU", [blob], [f"{blob}_d"], dev))
    predict.external_input.extend(f"r{r}/W" for r in range(len(devices)))
    for r, dev in enumerate(devices):
        p = f"r{r}/"
        predict.op.extend([
            _op("MatMul", [p + "X_d", p + "W"], [p + "y"], dev, trans_b=1),
            _op("Sub", [p + "y", p + "T_d"], [p + "diff"], dev),
            _op("Scale", [p + "diff"], [p + "g"], dev, scale=2.0 / (batch * n_out)),
            _op("MatMul", [p + "g", p + "X_d"], [p + "dW"], dev, trans_a=1),
        ])
    grads = [f"r{r}/dW" for r in range(len(devices))]
    if gpu:
        predict.op.append(_op("NCCLAllreduce", grads, grads, devices[0]))
    else:
        predict.op.append(_op("Allreduce", ["dp_cw", *grads], grads, devices[0]))
    for r, dev in enumerate(devices):
        p = f"r{r}/"
        predict.op.extend([_op("Scale", [p + "dW"], [p + "step"], dev, scale=lr),
                           _op("Sub", [p + "W", p + "step"], [p + "W"], dev)])
    return predict, init, inputs, w0, types


def sgd_reference(inputs: dict, w0: np.ndarray, steps: int, lr: float = 0.1, replicas: int = 2) -> np.ndarray:
    """``steps`` of full-batch gradient descent on mean squared error, in float64."""
    x = np.concatenate([inputs[f"r{r}/X"] for r in range(replicas)]).astype(np.float64)
    t = np.concatenate([inputs[f"r{r}/T"] for r in range(replicas)]).astype(np.float64)
    w = w0.astype(np.float64)
    for _ in range(steps):
        g = 2.0 / t.size * (x @ w.T - t)
        w = w - lr * (g.T @ x)
    return w


def chain_net(layers: int = 6, width: int = 256, batch: int = 4):
    """A chain of FC + Relu layers (placer Net with an init net) of ``width`` x ``width``."""
    from placer.formats.caffe2 import net_from_netdef
    predict, init = pb.NetDef(name="chain"), pb.NetDef(name="chain_init")
    predict.external_input.append("x")
    prev = "x"
    for i in range(layers):
        w, b = f"fc{i}_w", f"fc{i}_b"
        init.op.append(_gaussian(w, (width, width), 1 / np.sqrt(width)))
        init.op.append(_gaussian(b, (width,), 0.1))
        predict.external_input.extend([w, b])
        predict.op.append(pb.OperatorDef(type="FC", input=[prev, w, b], output=[f"fc{i}"], name=f"fc{i}"))
        predict.op.append(pb.OperatorDef(type="Relu", input=[f"fc{i}"], output=[f"relu{i}"], name=f"relu{i}"))
        prev = f"relu{i}"
    predict.external_output.append(prev)
    net = net_from_netdef(predict, init)
    net.input_shapes["x"] = TensorType((batch, width), "float32")
    return net


def _gaussian(name: str, shape: tuple, std: float):
    """A random fill (the executor seeds it from the blob's name: the same values wherever it runs)."""
    op = pb.OperatorDef(type="GaussianFill", output=[name])
    op.arg.add(name="shape", ints=list(shape))
    op.arg.add(name="std", f=float(std))
    return op


# Reductions whose float32 result depends on the order of their terms, and the number of
# terms K each output element sums, from the op's input types.
def _terms(op, types) -> int:
    shapes = [types.get(b).shape if types.get(b) is not None else None for b in op.inputs]
    if op.type in ("FC", "Conv") and len(shapes) > 1 and shapes[1]:
        return int(np.prod(shapes[1][1:]))              # W is (N, K) / (M, C/g, kh, kw)
    if op.type in ("MatMul", "BatchMatMul") and shapes and shapes[0]:
        return int(max(shapes[0][-2:]))                  # either side of A, whatever its trans
    if op.type.startswith("SparseLengths") and len(shapes) > 1 and shapes[1]:
        return int(shapes[1][0])                         # one segment may hold every index
    return 0


def summation_order_rtol(net) -> float:
    """A bound on the relative difference of ``net``'s outputs between two runs that sum in
    other orders (another process, another BLAS thread count or kernel).

    A float32 sum of K terms, in any order, is within gamma_K ~ K * 2**-24 of the exact sum
    times the sum of the terms' magnitudes; two orders differ by twice that. Errors of
    successive reductions add along a path (ReLU and Sigmoid pass a relative error through
    with a gain <= 1), so the bound is 2 * 2**-24 times the largest sum of K along any path
    from an input to an output, to first order and for terms of one sign; a net whose sums
    cancel (|sum| << sum of |terms|) can exceed it, which these test nets do not.
    """
    from placer.shapes import infer
    typed = infer(net, {})
    depth: dict[str, int] = {}
    for op in net.ops:
        k = max((depth.get(b, 0) for b in op.inputs), default=0) + _terms(op, typed.blobs)
        for b in op.outputs:
            depth[b] = max(depth.get(b, 0), k)
    return 2 * 2.0 ** -24 * max(depth.values(), default=0)


def assert_equal_up_to_summation_order(got, want, net) -> None:
    """``got`` equals ``want`` to the bound of ``summation_order_rtol(net)``, relative to
    the largest magnitude of ``want`` (outputs near zero carry their neighbours' error)."""
    rtol = summation_order_rtol(net)
    assert 0 < rtol < 1e-2, rtol
    want = np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))
