"""placer's CPU runtime against onnxruntime's CPU provider on the same nets and weights.

Usage: python bench/cpu_vs_onnxruntime.py [--repeats 5] [--threads N] [--nets resnet50-1,resnet50-8,alexnet-1]
Each Caffe prototxt from the corpus is converted by ``placer.formats.load_net`` (random
weights from its init net), run by the Executor, then rebuilt as an ONNX graph with the
onnx helper API from the very same weight arrays and run by onnxruntime in this process.
Prints: median wall time per run of both, their ratio (ours / onnxruntime; target <=
1.5), the largest output difference (a check that both ran the same net), and where our
time goes per op type. A benchmark prints figures; it is not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path


def _threads_from_argv() -> int | None:
    """--threads N must act before numpy loads its BLAS, so it is read here, first."""
    if "--threads" in sys.argv:
        return int(sys.argv[sys.argv.index("--threads") + 1])
    return None


THREADS = _threads_from_argv()
if THREADS:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(THREADS)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.formats import load_net  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402
from placer.shapes import infer  # noqa: E402
from placer.types import TensorType  # noqa: E402

ORT_OPT = "all"
CORPUS = ROOT.parent / "shared" / "nets" / "caffe"
NETS = {"resnet50": "resnet50_ResNet-50-deploy.prototxt", "alexnet": "bvlc_alexnet_deploy.prototxt"}


def _pads(args) -> list[int]:
    """Caffe2 padding arguments as ONNX pads [top, left, bottom, right]."""
    if "pads" in args:
        return args.ints("pads")
    p = args.int("pad", 0)
    return [args.int("pad_t", p), args.int("pad_l", p), args.int("pad_b", p), args.int("pad_r", p)]


def _hw(args, name: str, default: int) -> list[int]:
    if name + "s" in args:
        return args.ints(name + "s")
    v = args.int(name, default)
    return [args.int(name + "_h", v), args.int(name + "_w", v)]


def to_onnx(net, params: dict, types: dict):
    """An ONNX model equivalent to ``net`` (the op mix of converted Caffe CNNs)."""
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, extra = [], [numpy_helper.from_array(np.asarray(v), k) for k, v in params.items()], 0

    def const(name: str, array: np.ndarray) -> str:
        nonlocal extra
        extra += 1
        inits.append(numpy_helper.from_array(array, f"{name}__{extra}"))
        return f"{name}__{extra}"

    current: dict[str, str] = {}  # ONNX is SSA: a blob written again (in place) gets a new name
    defined = set(params) | set(net.data_inputs)

    def version(name: str) -> str:
        new = name if name not in defined else f"{name}__v{len(defined)}"
        defined.add(new)
        current[name] = new
        return new

    for op in net.ops:
        a, i = op.args, [current.get(n, n) for n in op.inputs]
        o = [version(n) for n in op.outputs]
        t = op.type
        if t == "Conv":
            nodes.append(helper.make_node("Conv", i, o[:1], kernel_shape=_hw(a, "kernel", 1),
                                          strides=_hw(a, "stride", 1), pads=_pads(a),
                                          dilations=_hw(a, "dilation", 1), group=a.int("group", 1)))
        elif t in ("MaxPool", "AveragePool"):
            if a.bool("global_pooling", False):
                nodes.append(helper.make_node("Global" + t, i, o[:1]))
                continue
            kw = dict(kernel_shape=_hw(a, "kernel", 1), strides=_hw(a, "stride", 1), pads=_pads(a),
                      ceil_mode=int(a.int("legacy_pad", 0) == 3))
            if t == "AveragePool":
                kw["count_include_pad"] = 1
            nodes.append(helper.make_node(t, i, o[:1], **kw))
        elif t in ("Relu", "Sigmoid", "Tanh", "Sum"):
            nodes.append(helper.make_node(t, i, o[:1]))
        elif t in ("Dropout", "Copy"):
            nodes.append(helper.make_node("Identity", i[:1], o[:1]))
        elif t == "Softmax":
            nodes.append(helper.make_node("Softmax", i, o[:1], axis=a.int("axis", 1)))
        elif t == "LRN":
            nodes.append(helper.make_node("LRN", i, o[:1], size=a.int("size"), alpha=a.float("alpha"),
                                          beta=a.float("beta"), bias=a.float("bias", 1.0)))
        elif t == "FC":
            flat = o[0] + "__flat"
            nodes.append(helper.make_node("Flatten", i[:1], [flat], axis=a.int("axis", 1)))
            nodes.append(helper.make_node("Gemm", [flat, *i[1:]], o[:1], transB=1))
        elif t == "SpatialBN":
            nodes.append(helper.make_node("BatchNormalization", i[:5], o[:1], epsilon=a.float("epsilon", 1e-5)))
        elif t in ("Mul", "Add"):
            (x, y), (ox, oy) = i, op.inputs
            ty, tx = types.get(oy), types.get(ox)
            if a.int("broadcast", 0) and ty is not None and tx is not None and oy in params:
                axis = a.int("axis", -1) % tx.ndim if a.int("axis", -1) != -1 else tx.ndim - ty.ndim
                shape = ty.shape + (1,) * (tx.ndim - axis - ty.ndim)
                y = const(y, np.asarray(params[oy]).reshape(shape))
            nodes.append(helper.make_node(t, [x, y], o[:1]))
        elif t == "Concat":
            nodes.append(helper.make_node("Concat", i, o[:1], axis=a.int("axis", 1)))
        else:
            raise ValueError(f"no ONNX mapping for {op.label}: this benchmark covers the ops of its nets only")
    for name in net.external_outputs:
        if current.get(name, name) != name:
            nodes.append(helper.make_node("Identity", [current[name]], [name]))

    def info(name):
        tt = types[name]
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(tt.shape))
    graph = helper.make_graph(nodes, net.name or "net", [info(n) for n in net.data_inputs if n not in params],
                              [info(n) for n in net.external_outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def bench(name: str, batch: int, repeats: int) -> None:
    import onnxruntime as ort
    if name in NETS:
        net = load_net(CORPUS / NETS[name])
    else:  # a bundled example net (e.g. resnet_small), written to a temporary folder
        import tempfile
        from placer.examples import builders
        files = builders()[name]().save(tempfile.mkdtemp(), name)
        net = load_net(files["predict"], init_path=files["init"])
    shapes = {n: TensorType((batch,) + t.shape[1:], t.dtype) for n, t in net.input_shapes.items()}
    if not shapes:  # Caffe2 files carry no input shapes: the first data input is an image
        shapes = {net.data_inputs[0]: TensorType((batch, 3, 64, 64))}
    typed = infer(net, shapes)
    ex = Executor(net, input_types=shapes)
    params = {k: np.asarray(v) for k, v in ex.run_init().items()}
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(t.shape).astype(t.dtype) for n, t in shapes.items()}

    t0 = time.perf_counter()
    ex.run(feed, iterations=1, warmup=1)
    ours, per_type = [], defaultdict(list)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = ex.run(feed, iterations=1, warmup=0)
        ours.append(time.perf_counter() - t0)
        run_by_type = defaultdict(float)
        for o in ex.record.ops:
            run_by_type[o.type] += o.time_s
        for t, sec in run_by_type.items():
            per_type[t].append(sec)
    by_type = {t: statistics.median(v) for t, v in per_type.items()}  # same runs as the wall median

    model = to_onnx(net, params, typed.blobs)
    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[ORT_OPT]
    if THREADS:
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ort_out = sess.run(None, feed)
    theirs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ort_out = sess.run(None, feed)
        theirs.append(time.perf_counter() - t0)
    diff = max(float(np.max(np.abs(out[n] - r))) for n, r in zip(net.external_outputs, ort_out))
    m_ours, m_ort = statistics.median(ours), statistics.median(theirs)
    print(f"{name} batch {batch}: placer {m_ours * 1e3:8.1f} ms   onnxruntime {m_ort * 1e3:8.1f} ms   "
          f"ratio {m_ours / m_ort:5.2f}x   max |diff| {diff:.2e}")
    total = sum(by_type.values())
    for t, s in sorted(by_type.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {t:<14} {s * 1e3:8.1f} ms  {100 * s / total:5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nets", default="resnet50-1,resnet50-8,alexnet-1")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both (BLAS and onnxruntime intra-op); default: their own")
    parser.add_argument("--ort-opt", choices=("all", "none"), default="all",
                        help="onnxruntime graph optimizations (none: no Conv+BN+Relu fusion, "
                             "op for op like placer)")
    a = parser.parse_args()
    global ORT_OPT
    ORT_OPT = a.ort_opt
    for spec in a.nets.split(","):
        name, _, batch = spec.partition("-")
        bench(name, int(batch or 1), a.repeats)


if __name__ == "__main__":
    main()
