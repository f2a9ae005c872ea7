"""ONNX models in: a ModelProto converted to Caffe2 predict and init NetDefs.

The conversion follows Caffe2's own ONNX backend (``caffe2.python.onnx.backend`` and its C++
half, in torch 1.8.1): the same Caffe2 op for each ONNX op, its renamed attributes
(``kernel_shape`` -> ``kernels``, ``perm`` -> ``axes``, ``axes`` -> ``dims``,
``output_padding`` -> ``adjs``), initializers as ``GivenTensor*Fill`` ops of the init net.
The op table is ``formats/onnx_ops.py``. What differs, on purpose:

- Inputs are bound to static shapes first: a symbolic dimension (a batch named ``N``) takes
  the user's ``--input`` shape or 1, and the choice is noted. Shapes then come from ONNX's
  own shape inference (``onnx.shape_inference``, with data propagation).
- What is constant is folded at conversion time (``Constant``, ``Shape``, ``Size``,
  ``ConstantOfShape`` and whatever computes only from them and from initializers: the
  Shape -> Gather -> Concat -> Reshape chains that exporters write), each node evaluated by
  ONNX's reference implementation (``onnx.reference``). So Reshape, Slice, Squeeze, Pad,
  Expand and Resize get static arguments where Caffe2's backend built shape blobs at run time.
- Opsets 9 through the installed ``onnx``'s newest are read as they are; an older model is
  first raised to opset 9 by ``onnx.version_converter`` (noted).

Bad files are one-line ``NetParseError``s: not ONNX or truncated, refused by ``onnx.checker``,
an opset outside what is read, an initializer or input that is missing, a graph whose nodes
are not in topological order (a cycle), and an op with no mapping (its node, op type, opset
and the nearest supported form).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.errors import NetParseError, PlacerError
from placer.formats.caffe2 import net_from_netdef
from placer.formats.caffe2_pb import NetDef
from placer.formats.convert import set_arg, set_float_values
from placer.formats.onnx_ops import HANDLERS, UNMAPPED_HINTS, OnnxNode
from placer.types import DTYPE_TO_DATA_TYPE, Net, TensorType, shape_problem

OLDEST_OPSET = 9            # Caffe2's backend targets 9; older models are raised to it
FOLD_MAX_ELEMENTS = 1 << 24  # a folded constant larger than this stays an op (16M values)
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout"})
# Folded only through these when their input is a graph input: what they read is its shape.
SHAPE_ONLY = frozenset({"Shape", "Size"})
# ONNX TensorProto element types -> numpy dtype names placer knows
ELEM_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}


def _onnx():
    import onnx  # a dependency of placer, loaded when an ONNX file is read
    return onnx


def looks_like_onnx(data: bytes, path: str | os.PathLike = "") -> bool:
    """Whether ``data`` is (meant to be) an ONNX ModelProto: a ``.onnx`` file, or bytes that
    begin with ModelProto's field 1 (ir_version, a varint) and parse as a model with a graph.
    A Caffe2 binary NetDef begins with field 1 or 2 as length-delimited bytes, never 0x08."""
    if str(path).lower().endswith(".onnx"):
        return True
    if not data or data[0] != 0x08:
        return False
    onnx = _onnx()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        return False
    return model.HasField("graph") and len(model.opset_import) > 0


@dataclass
class OnnxConversion:
    """What ``convert_onnx`` made: the two NetDefs, the inputs' static shapes, the
    parameters' shapes and what the user should know (bound dimensions, folded nodes)."""

    predict: object
    init: object
    input_shapes: dict[str, TensorType]
    param_shapes: dict[str, tuple]
    opset: int
    notes: list[str] = field(default_factory=list)
    folded: int = 0
    node_count: int = 0


def read_model(path: str | os.PathLike, data: bytes | None = None):
    """The ModelProto of ``path`` (external data loaded from beside it), checked by
    ``onnx.checker``; any failure is one NetParseError line."""
    onnx = _onnx()
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise NetParseError(str(path), f"cannot read: {e.strerror or e}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        raise NetParseError(str(path), "not a valid ONNX model (the protobuf does not parse: truncated "
                                       "or another kind of file)",
                            hint="re-export it, e.g. with torch.onnx.export") from None
    if not model.HasField("graph"):
        raise NetParseError(str(path), "not a valid ONNX model: it has no graph (an empty or truncated file?)",
                            hint="re-export it, e.g. with torch.onnx.export")
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(Path(path).parent))
        except Exception as e:  # OSError, or onnx's ValidationError for a path that is no file
            raise NetParseError(str(path), f"an initializer's external data cannot be read: {_first_line(e)}",
                                hint="keep the .data file(s) the exporter wrote beside the .onnx file") from None
    _check(model, path)
    return model


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check(model, path) -> None:
    onnx = _onnx()
    opset = default_opset(model, path)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise NetParseError(str(path), f"opset {opset} is newer than the installed onnx {onnx.__version__} "
                                       f"knows (up to {newest})",
                            hint="upgrade the onnx package, or export with an older opset_version")
    _check_topological(model.graph, path)
    try:
        if model.ByteSize() < (1 << 31) - (1 << 20):
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise NetParseError(str(path), f"onnx.checker refuses the model: {_first_line(e)}",
                            hint="re-export it; placer reads models the ONNX checker accepts") from None
    except Exception as e:  # the checker raises others for malformed fields
        raise NetParseError(str(path), f"onnx.checker refuses the model: {_first_line(e)}",
                            hint="re-export it; placer reads models the ONNX checker accepts") from None


def default_opset(model, path) -> int:
    """The version of the default ("" or "ai.onnx") operator set the model imports."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    if model.ir_version >= 3:
        raise NetParseError(str(path), "the model imports no version of the default ONNX operator set",
                            hint="re-export it; every ONNX model since IR version 3 names its opset")
    return 1


def _check_topological(graph, path) -> None:
    """Every node's inputs exist before it: graph inputs, initializers, earlier nodes'
    outputs (ONNX requires topological order, so a node reading a later one's output is a
    cycle or a misordered graph), names the checker reports less clearly."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    later = {o: k for k, n in enumerate(graph.node) for o in n.output}
    for k, node in enumerate(graph.node):
        for name in node.input:
            if name in known:
                continue
            label = _node_label(node, k)
            if name in later:
                raise NetParseError(str(path), f"node {label} reads '{name}', which node "
                                               f"{_node_label(graph.node[later[name]], later[name])} makes later: "
                                               "the graph has a cycle or is not in topological order",
                                    hint="ONNX graphs list nodes in topological order; re-export the model")
            raise NetParseError(str(path), f"node {label} reads '{name}', which no node, graph input or "
                                           "initializer provides (a missing initializer?)",
                                hint="re-export the model with its initializers (export_params=True)")
        known.update(node.output)


def _node_label(node, k: int) -> str:
    return f"#{k} '{node.name}' ({node.op_type})" if node.name else f"#{k} ({node.op_type})"


# ---------------------------------------------------------------- binding and inference

def bind_inputs(model, input_shapes: dict[str, TensorType] | None, path) -> tuple[dict[str, TensorType], list[str]]:
    """Static shapes of the graph's data inputs (those that are not initializers): the
    user's shape, else the file's, a symbolic or missing dimension taking 1 (noted)."""
    onnx = _onnx()
    user = dict(input_shapes or {})
    inits = {t.name for t in model.graph.initializer}
    shapes, notes = {}, []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None:
            raise NetParseError(str(path), f"graph input '{vi.name}' is not a tensor "
                                           f"({vi.type.WhichOneof('value')}): placer reads tensor inputs only")
        dtype = ELEM_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise NetParseError(str(path), f"graph input '{vi.name}' has element type "
                                           f"{onnx.TensorProto.DataType.Name(tt.elem_type)}, which placer does not run",
                                hint="export the model with float, integer or bool inputs")
        if vi.name in user:
            given = user.pop(vi.name)
            if tt.HasField("shape") and len(given.shape) != len(tt.shape.dim):
                raise PlacerError(f"--input {vi.name}: {len(given.shape)} dimensions given, but {path} declares "
                                  f"{len(tt.shape.dim)} ({_dims_text(tt.shape.dim)})",
                                  hint="give one size per dimension of the model's input")
            for k, (d, g) in enumerate(zip(tt.shape.dim, given.shape)):
                if d.HasField("dim_value") and d.dim_value != g:
                    raise PlacerError(f"--input {vi.name}: dimension {k} is {g}, but {path} fixes it at "
                                      f"{d.dim_value} ({_dims_text(tt.shape.dim)})",
                                      hint="only the model's symbolic dimensions can be chosen")
            if given.dtype not in (dtype, "float32"):  # float32 is --input's default, not a choice
                raise PlacerError(f"--input {vi.name}: dtype {given.dtype}, but {path} declares {dtype}",
                                  hint=f"feed {dtype}, or leave the dtype out")
            shapes[vi.name] = TensorType(tuple(given.shape), dtype)
            continue
        if not tt.HasField("shape"):
            raise PlacerError(f"{path}: graph input '{vi.name}' has no shape",
                              hint=f"give it with --input {vi.name}=D1,D2,...")
        dims, bound = [], []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(1)
                bound.append(d.dim_param or f"dim {k}")
        if bound:
            notes.append(f"input '{vi.name}': {', '.join(bound)} set to 1 (shape {tuple(dims)}); "
                         f"--input {vi.name}=... chooses other sizes")
        shapes[vi.name] = TensorType(tuple(dims), dtype)
    if user:
        names = [n for n in shapes]
        raise PlacerError(f"--input {next(iter(user))}=...: {path} has no data input of that name "
                          f"(its inputs: {', '.join(names[:8]) or 'none'})")
    for name, t in shapes.items():
        problem = shape_problem(t.shape)
        if problem:
            raise PlacerError(f"{path}: input '{name}': {problem}")
    return shapes, notes


def _dims_text(dims) -> str:
    return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)


class Graph:
    """The graph being converted: its nodes, the values known to be constant, the static
    types from shape inference, and the opset; shared by the folding and the op handlers."""

    def __init__(self, model, path, opset: int, inputs: dict[str, TensorType]):
        onnx = _onnx()
        self.path = str(path)
        self.opset = opset
        self.model = model
        self.nodes = list(model.graph.node)
        self.inputs = inputs
        self.consts: dict[str, np.ndarray] = {}
        for t in model.graph.initializer:
            if t.name not in inputs:
                self.consts[t.name] = onnx.numpy_helper.to_array(t)
        self.initializers = set(self.consts)
        self.types: dict[str, TensorType] = dict(inputs)

    def infer(self) -> None:
        """Static shapes of every value, from ONNX's shape inference over a copy of the
        graph whose constants are declared with their shapes (large ones without data)."""
        onnx = _onnx()
        helper = onnx.helper
        g = self.model.graph
        inputs = [helper.make_tensor_value_info(n, _elem(t.dtype), t.shape) for n, t in self.inputs.items()]
        inits = []
        for name, arr in self.consts.items():
            if arr.size <= 4096:
                inits.append(onnx.numpy_helper.from_array(arr, name))
            else:
                inputs.append(helper.make_tensor_value_info(name, _elem(str(arr.dtype)), arr.shape))
        graph = helper.make_graph(self.nodes, g.name or "g", inputs, list(g.output), inits)
        skeleton = helper.make_model(graph, opset_imports=list(self.model.opset_import),
                                     ir_version=max(self.model.ir_version, 4))
        skeleton.functions.extend(self.model.functions)
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=True,
                                                         data_prop=True)
        except Exception as e:
            raise NetParseError(self.path, f"ONNX shape inference fails: {_first_line(e)}",
                                hint="check the input shapes (--input) against the model") from None
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = _static_type(vi)
            if t is not None:
                self.types[vi.name] = t
        for name, arr in self.consts.items():
            self.types[name] = TensorType(tuple(arr.shape), _np_dtype_name(arr.dtype))

    def type_of(self, name: str) -> TensorType | None:
        return self.types.get(name)


def _elem(dtype: str) -> int:
    return {v: k for k, v in ELEM_DTYPES.items()}.get(dtype, 1)


def _np_dtype_name(dtype) -> str:
    return str(np.dtype(dtype)) if str(dtype) != "bfloat16" else "bfloat16"


def _static_type(vi) -> TensorType | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    dtype = ELEM_DTYPES.get(tt.elem_type)
    if dtype is None or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return TensorType(tuple(dims), dtype)


# ---------------------------------------------------------------- constant folding

def fold_constants(graph: Graph) -> int:
    """Evaluate, with ONNX's reference implementation, every node whose inputs are all
    constant (and Shape/Size of values whose shape is static); their outputs become
    constants and the nodes leave the graph. Repeated with fresh shape inference until
    nothing more folds (a Reshape's output shape is known only once its shape input is)."""
    onnx = _onnx()
    from onnx.reference import ReferenceEvaluator  # part of onnx; heavy, loaded when folding
    opsets = {imp.domain or "": imp.version for imp in graph.model.opset_import}
    total = 0
    while True:
        graph.infer()
        kept, folded = [], 0
        for node in graph.nodes:
            values = _fold_node(graph, node, opsets, ReferenceEvaluator, onnx)
            if values is None:
                kept.append(node)
                continue
            for name, value in zip(node.output, values):
                if name:
                    graph.consts[name] = np.asarray(value)
            folded += 1
        graph.nodes = kept
        total += folded
        if not folded:
            return total


def _fold_node(graph: Graph, node, opsets, evaluator, onnx):
    if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    if node.op_type in SHAPE_ONLY and node.input and node.input[0] not in graph.consts:
        t = graph.type_of(node.input[0])
        if t is None:
            return None
        if node.op_type == "Size":
            return [np.array(int(np.prod(t.shape, dtype=np.int64)), dtype=np.int64)]
        shape = np.array(t.shape, dtype=np.int64)
        start = _attr_int(node, "start", 0)
        end = _attr_int(node, "end", None)
        return [shape[start:end]]
    inputs = [n for n in node.input if n]
    if not all(n in graph.consts for n in inputs):
        return None
    out_types = [graph.type_of(o) for o in node.output if o]
    if any(t is not None and t.size > FOLD_MAX_ELEMENTS for t in out_types):
        return None
    try:
        ev = evaluator(onnx.helper.make_graph(
            [node], "fold",
            [onnx.helper.make_tensor_value_info(n, _elem(_np_dtype_name(graph.consts[n].dtype)), None)
             for n in dict.fromkeys(inputs)],
            [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output if o]), opsets=opsets)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = ev.run(None, {n: graph.consts[n] for n in inputs})
    except Exception:
        return None  # left to the converter, which names what it cannot map
    if any(np.asarray(v).size > FOLD_MAX_ELEMENTS for v in values):
        return None
    by_name = dict(zip([o for o in node.output if o], values))
    return [by_name.get(o) for o in node.output]


def _attr_int(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


# ---------------------------------------------------------------- the conversion

class Converter:
    """Emits the Caffe2 ops of each remaining node (``onnx_ops.HANDLERS``) and the init
    net's fill ops of the constants those ops read."""

    def __init__(self, graph: Graph, name: str):
        self.g = graph
        self.predict = NetDef(name=name)
        self.init = NetDef(name=f"{name}_init")
        self.params: dict[str, tuple] = {}
        self.notes: list[str] = []
        self.node = None
        self.node_index = -1
        self.aliases: dict[str, str] = {}
        self._taken = set(graph.consts) | set(graph.inputs) | {o for n in graph.nodes for o in n.output}

    # -- used by the handlers
    def op(self, type_: str, inputs, outputs, **args):
        proto = self.predict.op.add(type=type_, name=self.node.name if self.node is not None else "")
        proto.input.extend(inputs)
        proto.output.extend(outputs)
        for key, value in args.items():
            if value is not None:
                set_arg(proto.arg.add(name=key), value)
        return proto

    def alias(self, out: str, src: str) -> None:
        """``out`` is ``src`` (a node that changes nothing: a Pad of zeros, a full Slice):
        no op is written, and later readers of ``out`` read ``src``; a graph output still
        gets its own blob (a Copy at the end)."""
        src = self.aliases.get(src, src)
        if src in self.g.consts:
            self.g.consts[out] = self.g.consts[src]
        else:
            self.aliases[out] = src

    def resolve(self, name: str) -> str:
        return self.aliases.get(name, name)

    def fresh(self, base: str) -> str:
        """A blob name no value of the graph uses."""
        name, k = base, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def const_input(self, name: str, values: np.ndarray | None = None, as_name: str | None = None) -> str:
        """The blob of a constant an op reads as a tensor: filled by the init net (once)."""
        arr = self.g.consts[name] if values is None else np.asarray(values)
        blob = as_name or name
        if blob in self.params:
            return blob
        self._fill(blob, arr)
        self.params[blob] = tuple(arr.shape)
        if blob not in self.predict.external_input:
            self.predict.external_input.append(blob)
        return blob

    def new_param(self, base: str, values: np.ndarray) -> str:
        return self.const_input(base, values, as_name=self.fresh(base))

    def _fill(self, name: str, arr: np.ndarray) -> None:
        dtype = arr.dtype
        if dtype == np.float16:
            half = name
            staging = self.fresh(f"{name}_fp32")
            self._given(staging, arr.astype(np.float32))
            op = self.init.op.add(type="FloatToHalf")
            op.input.append(staging)
            op.output.append(half)
            return
        self._given(name, arr)

    def _given(self, name: str, arr: np.ndarray) -> None:
        kinds = {np.dtype(np.float32): "GivenTensorFill", np.dtype(np.float64): "GivenTensorDoubleFill",
                 np.dtype(np.int32): "GivenTensorIntFill", np.dtype(np.int64): "GivenTensorInt64Fill",
                 np.dtype(np.int16): "GivenTensorInt16Fill", np.dtype(np.bool_): "GivenTensorBoolFill",
                 np.dtype(np.uint8): "GivenTensorByteStringToUInt8Fill"}
        op_type = kinds.get(arr.dtype)
        if op_type is None:
            if np.issubdtype(arr.dtype, np.integer):
                arr, op_type = arr.astype(np.int64), "GivenTensorInt64Fill"
            else:
                raise NetParseError(self.g.path, f"constant '{name}' has dtype {arr.dtype}, which no Caffe2 "
                                                 "fill op holds")
        proto = self.init.op.add(type=op_type)
        proto.output.append(name)
        set_arg(proto.arg.add(name="shape"), [int(d) for d in arr.shape])
        values = proto.arg.add(name="values")
        flat = arr.reshape(-1)
        if op_type == "GivenTensorFill":
            set_float_values(values, flat)
        elif op_type == "GivenTensorByteStringToUInt8Fill":
            values.strings.append(flat.tobytes())
        elif op_type == "GivenTensorDoubleFill":
            values.floats.extend(flat.astype(np.float64).tolist())
        else:
            values.ints.extend(int(v) for v in flat.astype(np.int64))

    def fail(self, message: str, hint: str | None = None):
        raise NetParseError(self.g.path, f"node {_node_label(self.node, self.node_index)}, opset "
                                         f"{self.g.opset}: {message}", hint=hint)

    # -- the driver
    def run(self) -> None:
        g = self.g
        self.predict.external_input.extend(g.inputs)
        for k, node in enumerate(g.nodes):
            self.node, self.node_index = node, k
            if node.domain not in ("", "ai.onnx"):
                self.fail(f"op {node.domain}::{node.op_type} is outside the default ONNX domain",
                          hint="placer maps the standard ONNX operators; export without custom ops")
            handler = HANDLERS.get(node.op_type)
            if handler is None:
                hint = UNMAPPED_HINTS.get(node.op_type, "placer maps the ONNX ops Caffe2's backend mapped; "
                                                        "see the README's ONNX section for the list")
                self.fail(f"op type {node.op_type} has no Caffe2 mapping", hint=hint)
            handler(self, OnnxNode(node, self))
        self.node = None
        for out in g.model.graph.output:
            self._output(out.name)

    def _output(self, name: str) -> None:
        produced = {o for op in self.predict.op for o in op.output}
        if name not in produced:
            if name in self.g.consts:
                src = self.const_input(name, as_name=self.fresh(f"{name}_const"))
            elif name in self.g.inputs or name in self.aliases:
                src = self.resolve(name)
            else:
                raise NetParseError(self.g.path, f"graph output '{name}' is made by no node")
            self.op("Copy", [src], [name])
        self.predict.external_output.append(name)


def convert_onnx(path: str | os.PathLike, input_shapes: dict[str, TensorType] | None = None,
                 data: bytes | None = None) -> OnnxConversion:
    """Read, check, bind, fold and convert an ONNX model to Caffe2 NetDefs."""
    onnx = _onnx()
    model = read_model(path, data)
    opset = default_opset(model, path)
    notes = []
    if opset < OLDEST_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, OLDEST_OPSET)
        except Exception as e:
            raise NetParseError(str(path), f"opset {opset} is older than placer reads ({OLDEST_OPSET} to "
                                           f"{onnx.defs.onnx_opset_version()}), and onnx.version_converter "
                                           f"cannot raise it: {_first_line(e)}",
                                hint=f"re-export with opset_version >= {OLDEST_OPSET}") from None
        notes.append(f"the model's opset {opset} was raised to {OLDEST_OPSET} by onnx.version_converter")
        opset = OLDEST_OPSET
    inputs, bind_notes = bind_inputs(model, input_shapes, path)
    notes += bind_notes
    graph = Graph(model, path, opset, inputs)
    node_count = len(graph.nodes)
    folded = fold_constants(graph)
    name = model.graph.name or Path(str(path)).stem
    cv = Converter(graph, name)
    cv.run()
    if folded:
        notes.append(f"{folded} of {node_count} nodes folded into constants at conversion")
    notes += cv.notes
    return OnnxConversion(cv.predict, cv.init, inputs, cv.params, opset, notes, folded, node_count)


def folded_model(path: str | os.PathLike, input_shapes: dict[str, TensorType] | None = None):
    """The model as the converter maps it: inputs bound to static shapes, constant nodes
    folded into initializers (the graph Caffe2's backend would be handed to map the same
    nodes: tests compare the two NetDefs op for op)."""
    onnx = _onnx()
    model = read_model(path)
    opset = default_opset(model, path)
    inputs, _ = bind_inputs(model, input_shapes, path)
    graph = Graph(model, path, opset, inputs)
    fold_constants(graph)
    used = {n for node in graph.nodes for n in node.input} | {o.name for o in model.graph.output}
    helper = onnx.helper
    g = helper.make_graph(
        graph.nodes, model.graph.name or "g",
        [helper.make_tensor_value_info(n, _elem(t.dtype), t.shape) for n, t in inputs.items()],
        list(model.graph.output),
        [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in graph.consts.items() if n in used])
    return helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def load_onnx_net(path: str | os.PathLike, input_shapes: dict[str, TensorType] | None = None,
                  data: bytes | None = None) -> Net:
    """An ONNX model as the ``Net`` the rest of placer works on (converted in memory)."""
    result = convert_onnx(path, input_shapes, data)
    net = net_from_netdef(result.predict, result.init, path=str(path), source_format="onnx")
    net.input_shapes.update(result.input_shapes)
    net.notes.extend(result.notes)
    return net


__all__ = ["OnnxConversion", "convert_onnx", "load_onnx_net", "looks_like_onnx", "read_model",
           "DTYPE_TO_DATA_TYPE"]
