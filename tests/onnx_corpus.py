"""The ONNX corpus under tests/data/onnx/: its manifest, its inputs, and whole models.

The files are exported by ``bench/onnx_corpus/export.py`` (torch.onnx, random weights) and
kept compact: every float initializer of more than 1024 elements keeps its name, dims and
data_type but has no data, and the model's metadata_props entry STRIPPED_KEY lists those
names (a JSON list). ``materialize(path)`` refills them deterministically, each from a
numpy generator seeded with a stable hash of the initializer's name, at PyTorch-like scale:

  * read by a BatchNormalization node as scale (input 1) or variance (input 4): U(0.5, 1.5);
    as bias (2) or mean (3): U(-0.1, 0.1);
  * the table of a Gather (input 0: an embedding, EmbeddingBag's too): N(0, 0.1);
  * the bias of a Conv or Gemm (input 2): U(+-1/sqrt(fan_in)) with the fan_in of that node's
    weight, as torch.nn.Conv2d and torch.nn.Linear draw theirs;
  * any other weight: U(+-1/sqrt(fan_in)) with fan_in = prod(dims[1:]) (Conv's [out, in/g,
    kh, kw], Linear's [out, in]); where the layout puts the input features first instead,
    fan_in is those: MatMul's B ([K, N]: K) and Gemm's B with transB=0 ([K, N]: K); a 1-D
    tensor not covered above takes fan_in = dims[0].
Consumers inside subgraphs (a Loop body reading an outer table) count.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(__file__).resolve().parent / "data" / "onnx"
MANIFEST = DATA / "manifest.json"
STRIPPED_KEY = "placer.stripped_initializers"
STRIP_ELEMENTS = 1024
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16)


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def seeded_inputs(spec: list[dict], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for one manifest entry: floats from a standard normal, integers (indices and
    offsets) uniform in the entry's [low, high). The export script drew its check inputs the same way."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in spec:
        if s["dtype"].startswith("int"):
            out[s["name"]] = rng.integers(s["low"], s["high"], size=s["shape"]).astype(s["dtype"])
        else:
            out[s["name"]] = rng.standard_normal(s["shape"]).astype(s["dtype"])
    return out


def name_seed(name: str) -> int:
    """A stable 64-bit seed from an initializer's name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def has_data(t: onnx.TensorProto) -> bool:
    return bool(t.raw_data or t.float_data or t.double_data or t.int32_data or t.int64_data
                or t.external_data)


def graphs(graph: onnx.GraphProto):
    """The graph and every subgraph below it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from graphs(g)


def stripped_names(model: onnx.ModelProto) -> list[str]:
    """The names the model's metadata says were stripped ([] when it has no such entry)."""
    for p in model.metadata_props:
        if p.key == STRIPPED_KEY:
            names = json.loads(p.value)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{STRIPPED_KEY} must be a JSON list of initializer names")
            return names
    return []


def _consumers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for g in graphs(model.graph):
        for node in g.node:
            for i, name in enumerate(node.input):
                uses.setdefault(name, []).append((node, i))
    return uses


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def fill_rule(t: onnx.TensorProto, uses: list[tuple[onnx.NodeProto, int]],
              dims_of: dict[str, list[int]]) -> tuple[str, float, float]:
    """(distribution, a, b) for one stripped tensor: ("uniform", low, high) or ("normal", mean, std)."""
    dims = list(t.dims)
    for node, i in uses:
        if node.op_type == "BatchNormalization" and i in (1, 4):
            return "uniform", 0.5, 1.5
        if node.op_type == "BatchNormalization" and i in (2, 3):
            return "uniform", -0.1, 0.1
    for node, i in uses:
        if node.op_type == "Gather" and i == 0:
            return "normal", 0.0, 0.1
    fan_in = None
    for node, i in uses:
        if node.op_type in ("Conv", "Gemm") and i == 2 and node.input[1] in dims_of:
            w = dims_of[node.input[1]]
            if node.op_type == "Gemm" and not _attr(node, "transB", 0):
                fan_in = w[0]
            else:
                fan_in = math.prod(w[1:])
            break
        if node.op_type == "MatMul" and i == 1 and len(dims) >= 2:
            fan_in = dims[-2]
            break
        if node.op_type == "Gemm" and i == 1 and not _attr(node, "transB", 0):
            fan_in = dims[0]
            break
    if fan_in is None:
        fan_in = math.prod(dims[1:]) if len(dims) > 1 else dims[0]
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return "uniform", -bound, bound


def materialize(path) -> onnx.ModelProto:
    """The model at ``path`` with its stripped initializers refilled (see the module docstring)."""
    model = onnx.load(str(path))
    names = stripped_names(model)
    if not names:
        return model
    inits: dict[str, onnx.TensorProto] = {}
    for g in graphs(model.graph):
        for t in g.initializer:
            inits.setdefault(t.name, t)
    dims_of = {n: list(t.dims) for n, t in inits.items()}
    uses = _consumers(model)
    for name in names:
        t = inits.get(name)
        if t is None:
            raise ValueError(f"{path}: {STRIPPED_KEY} names {name!r}, which is no initializer")
        if has_data(t):
            raise ValueError(f"{path}: stripped initializer {name!r} still has data")
        if t.data_type not in FLOAT_TYPES:
            raise ValueError(f"{path}: stripped initializer {name!r} is not a float tensor")
        kind, a, b = fill_rule(t, uses.get(name, []), dims_of)
        rng = np.random.default_rng(name_seed(name))
        shape = tuple(t.dims)
        if kind == "normal":
            arr = a + b * rng.standard_normal(shape, dtype=np.float32)
        else:
            arr = a + (b - a) * rng.random(shape, dtype=np.float32)
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        filled = numpy_helper.from_array(arr.astype(np_dtype, copy=False), name)
        t.CopyFrom(filled)
    return model
