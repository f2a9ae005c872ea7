"""ONNX's own backend node tests run through placer: convert each case's model with
``placer.formats.onnx``, run it on placer's executor, compare with ONNX's expected outputs.

Shared by ``bench/onnx_node_tests.py`` (the per-op report) and
``tests/test_onnx_node_tests.py`` (the assertions). The cases come from the installed onnx
wheel (``onnx.backend.test.case.node.collect_testcases``), generated in-process; each has a
model, data sets of (inputs, expected outputs) computed by ONNX's reference code, and the
rtol/atol ONNX's own runner uses (its defaults: rtol 1e-3, atol 1e-7).

A case is *not mapped* when one of its op types has no handler in
``placer.formats.onnx_ops.HANDLERS``. Inputs that exported models carry as constants (integer
tensors such as indices and shapes, and the attribute-like inputs listed in ``BAKED_INPUTS``)
are made initializers before conversion, with the data set's values, as an exporter with
static shapes would have written them; the outcome notes that it did.
"""
from __future__ import annotations

import io
import warnings
from collections import Counter
from contextlib import redirect_stderr
from dataclasses import dataclass

import numpy as np

from placer.errors import KernelMissingError, PlacerError
from placer.formats.onnx import load_onnx_net
from placer.formats.onnx_ops import HANDLERS
from placer.runtime.executor import Executor
from placer.types import TensorType

# Inputs (by op type, input positions) that real models give as constants: the bounds and
# shapes that older opsets took as attributes.
_REDUCE = {f"Reduce{k}": (1,) for k in ("Mean", "Sum", "Max", "Min", "L1", "L2", "Prod", "LogSum",
                                         "LogSumExp", "SumSquare")}
BAKED_INPUTS = {"Clip": (1, 2), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Upsample": (1,),
                "Slice": (1, 2, 3, 4), "Reshape": (1,), "Expand": (1,), "Tile": (1,), "TopK": (1,),
                "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ConstantOfShape": (0,), **_REDUCE}

# Ops whose integer inputs are all data (what the op computes on), never baked: an exported
# model feeds them like any tensor.
DATA_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less",
                      "Greater", "LessOrEqual", "GreaterOrEqual", "BitShift", "BitwiseAnd", "BitwiseOr",
                      "BitwiseXor", "BitwiseNot", "Where", "Neg", "Abs", "Sign", "Identity", "Clip",
                      "Relu", "Cast", "CastLike", "Concat", "Transpose", "Reshape", "Squeeze", "Unsqueeze",
                      "Flatten", "Expand", "Tile", "Pad", "Slice",
                      "Split", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ArgMax", "ArgMin",
                      "TopK", "MatMul"})

_CACHE: dict = {}


def node_cases():
    """The onnx wheel's node test cases, generated once per process (about 7 s)."""
    if "cases" not in _CACHE:
        from onnx.backend.test.case import node  # the onnx wheel's own test generator
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            _CACHE["cases"] = node.collect_testcases(None)
    return _CACHE["cases"]


def op_types(case) -> set[str]:
    return {n.op_type for n in case.model.graph.node}


def primary_ops(cases) -> dict[str, str]:
    """Case name -> the ONNX op it tests: the one op of its graph, or for an ``_expanded``
    case (the op's function body written out) the op of the case it expands."""
    single = {c.name: next(iter(op_types(c))) for c in cases if len(op_types(c)) == 1}
    out = {}
    for c in cases:
        name = c.name
        if name in single:
            out[name] = single[name]
            continue
        base = name.split("_expanded")[0]
        if base in single:
            out[name] = single[base]
            continue
        counts = Counter(n.op_type for n in c.model.graph.node)
        out[name] = counts.most_common(1)[0][0]
    return out


@dataclass
class Outcome:
    name: str
    op: str
    status: str          # "passed" | "failed" | "not mapped"
    reason: str = ""     # first line of why it failed; the unmapped op types when not mapped
    baked: bool = False  # inputs were made initializers first


def _bake(case, inputs: list):
    """The case's model with constant-like inputs turned into initializers; the remaining
    feeds. Returns (model, feeds {name: array}, baked?)."""
    import onnx  # the model is an onnx ModelProto
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    g = model.graph
    init_names = {t.name for t in g.initializer}
    graph_inputs = [vi.name for vi in g.input if vi.name not in init_names]
    values = dict(zip(graph_inputs, inputs))
    wanted = set()
    for node in g.node:
        for k in BAKED_INPUTS.get(node.op_type, ()):
            if k < len(node.input) and node.input[k] in values:
                wanted.add(node.input[k])
    data = {node.input[0] for node in g.node if node.input} | {
        i for node in g.node if node.op_type in DATA_OPS for k, i in enumerate(node.input)
        if k not in BAKED_INPUTS.get(node.op_type, ())}
    for name, v in values.items():
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.integer) and name not in data:
            wanted.add(name)
    wanted = {n for n in wanted if isinstance(values[n], np.ndarray)}
    if wanted:
        keep = [vi for vi in g.input if vi.name not in wanted]
        del g.input[:]
        g.input.extend(keep)
        for name in sorted(wanted):
            g.initializer.append(onnx.numpy_helper.from_array(values[name], name))
    feeds = {n: v for n, v in values.items() if n not in wanted}
    return model, feeds, bool(wanted)


def _as_array(v):
    if isinstance(v, np.generic):
        return np.asarray(v)
    if type(v).__name__ == "TensorProto":
        import onnx  # the value is an onnx TensorProto
        try:
            return onnx.numpy_helper.to_array(v)
        except Exception:
            return v
    return v


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def run_case(case, op: str) -> Outcome:
    """Convert, run and compare one case (every data set)."""
    missing = sorted(t for t in op_types(case) if t not in HANDLERS)
    if missing:
        return Outcome(case.name, op, "not mapped", ", ".join(missing))
    baked_any = False
    for inputs, expected in case.data_sets:
        # a scalar input or output is a numpy scalar (np.float32(2.0)) in ONNX's data sets
        # and a tensor of a type numpy lacks (float8, int4) a TensorProto
        inputs = [_as_array(v) for v in inputs]
        expected = [_as_array(v) for v in expected]
        if any(not isinstance(v, np.ndarray) for v in inputs):
            return Outcome(case.name, op, "failed", "input is not a tensor (sequence, optional or "
                                                    "TensorProto): placer feeds tensors only", baked_any)
        model, feeds, baked = _bake(case, inputs)
        baked_any = baked_any or baked
        shapes = {n: TensorType(tuple(int(d) for d in v.shape), str(v.dtype)) for n, v in feeds.items()}
        stage = "conversion"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                net = load_onnx_net(f"{case.name}.onnx", shapes, model.SerializeToString())
                stage = "kernel"
                ex = Executor(net)
                stage = "run"
                ex.run_init()
                got = ex.run(feeds, warmup=0)
        except KernelMissingError as e:
            return Outcome(case.name, op, "failed", f"missing kernel: {e.message.splitlines()[0]}", baked_any)
        except PlacerError as e:
            label = "conversion error" if stage == "conversion" else f"{stage} error"
            return Outcome(case.name, op, "failed", f"{label}: {e.message.splitlines()[0]}", baked_any)
        except Exception as e:  # a crash is a bug of placer: reported as such
            return Outcome(case.name, op, "failed", f"crash in {stage}: {_first_line(e)}", baked_any)
        names = [o.name for o in model.graph.output]
        problem = compare(names, got, expected, case.rtol, case.atol)
        if problem:
            return Outcome(case.name, op, "failed", problem, baked_any)
    return Outcome(case.name, op, "passed", "", baked_any)


def compare(names, got: dict, expected: list, rtol: float, atol: float) -> str:
    """'' when every output matches in dtype, shape and value (assert_allclose's rule,
    NaN equal to NaN), else the first mismatch in one line."""
    for name, want in zip(names, expected):
        if not isinstance(want, np.ndarray):
            return f"output '{name}' is a {type(want).__name__}, placer gives tensors only"
        if name not in got:
            return f"output '{name}' missing"
        have = np.asarray(got[name])
        if have.dtype != want.dtype:
            return f"wrong dtype: output '{name}' is {have.dtype}, expected {want.dtype}"
        if have.shape != want.shape:
            return f"wrong shape: output '{name}' is {have.shape}, expected {want.shape}"
        if want.dtype.kind in "fc":
            a, b = have.astype(np.float64), want.astype(np.float64)
            both_nan = np.isnan(a) & np.isnan(b)
            same_inf = np.isinf(a) & (a == b)
            with np.errstate(invalid="ignore"):
                ok = both_nan | same_inf | (np.abs(a - b) <= atol + rtol * np.abs(b))
            if not ok.all():
                err = np.where(ok, 0.0, np.abs(a - b))
                err = np.where(np.isnan(err), np.inf, err)
                k = int(np.argmax(err))
                return (f"wrong value: output '{name}' max error {float(err.reshape(-1)[k]):.3g} "
                        f"at flat index {k} ({int((~ok).sum())} of {ok.size} off; rtol {rtol}, atol {atol})")
        elif not np.array_equal(have, want):
            off = int((have != want).sum())
            return f"wrong value: output '{name}' differs in {off} of {want.size} elements"
    return ""


def run_all(cases=None, ops: set[str] | None = None) -> list[Outcome]:
    """Every case's outcome (those of ``ops`` only when given)."""
    cases = node_cases() if cases is None else cases
    prim = primary_ops(cases)
    out = []
    for c in cases:
        if ops is not None and prim[c.name] not in ops:
            continue
        out.append(run_case(c, prim[c.name]))
    return out
