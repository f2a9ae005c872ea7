"""Shape inference over a whole net: ``infer(net, input_shapes) -> TypedNet``.

Ops are walked in net order (a NetDef runs in order). Each op's registry entry gives its
output types and cost features; ``param_bytes`` is filled here because only the net
knows which inputs are parameters.

Missing shapes do not raise: a blob whose type cannot be known is None, the ops that
need it get ``known=False`` features, and ``TypedNet.missing`` names each root cause with
the option that supplies it, so that ``placer inspect`` can list them all at once.
Shapes that are known but do not fit an op raise ``ShapeError`` (the registry's message
names the op, the blobs and the shapes).

An op's output types and features are a function of its type, its argument values, its
input types (and which inputs are parameters) and its number of outputs: ops that agree
on all of them (the layers of a deep net) are inferred once per ``infer`` call, which
keeps a million-op net to seconds.

Data-dependent sizes (the proposals of GenerateProposals, the detections of
BoxWithNMSLimit) are inferred as the upper bound their op's arguments allow and marked
(``TensorType.bound``); every non-scalar output of an op that reads a marked blob (not
counting parameters) is marked too, since its size follows from it. ``counts`` prices a
typical case instead: ``{op type: N}`` cuts the leading dimension of that op type's own
marked outputs to at most N rows (``--proposals`` / ``--detections``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from placer.errors import PlacerError, ShapeError, excerpt
from placer.formats import nested
from placer.ops import control, registry
from placer.types import Net, Op, OpFeatures, TensorType, TypedNet

UNKNOWN = OpFeatures(known=False)


def infer(net: Net, input_shapes: dict[str, TensorType] | None = None,
          counts: Mapping[str, int] | None = None) -> TypedNet:
    """Types of every blob of ``net`` and the cost features of every op.

    Starting types: parameters (``net.params``), shapes the file carries
    (``net.input_shapes``), then the user's ``input_shapes`` (which win). A user shape
    for the output of an op placer cannot infer fills that output. ``counts``: see the
    module's docstring.
    """
    user = dict(input_shapes or {})
    blobs: dict[str, TensorType | None] = {**net.params, **net.input_shapes, **user}
    typed = TypedNet(net=net, blobs=blobs, features=[])
    producers: dict[str, Op] = {}  # the op that last wrote each blob, as the walk goes
    inferred: dict[tuple, tuple] = {}  # op signature -> (output types, features)
    for op in net.ops:
        typed.op_inputs.append(tuple(typed.blobs.get(b) for b in op.inputs))
        typed.features.append(_infer_op(typed, op, user, producers, inferred, counts or {}))
        typed.op_outputs.append(tuple(typed.blobs.get(b) for b in op.outputs))
        producers.update((out, op) for out in op.outputs)
    for blob in net.external_outputs:  # what the net hands back needs a shape too
        if blob in producers and typed.blobs.get(blob) is None:
            _note_missing(typed, blob, producers[blob])
    return typed


def args_key(args) -> tuple | None:
    """An op's argument values as a hashable key (each value with its type: 1, 1.0 and
    True are equal in Python); None when a value is no plain number, string or list of
    them (a nested net)."""
    items = []
    for name, value in args.items():
        if isinstance(value, list):
            value = tuple(value)
        if not isinstance(value, (int, float, str, bytes, tuple)):
            return None
        items.append((name, type(value).__name__, value))
    key = tuple(items)
    try:
        hash(key)
    except TypeError:  # a list of messages
        return None
    return key


def _infer_op(typed: TypedNet, op: Op, user: dict[str, TensorType],
              producers: dict[str, Op], inferred: dict[tuple, tuple], counts: Mapping[str, int]) -> OpFeatures:
    """Set the types of ``op``'s outputs in ``typed.blobs`` and return its features."""
    opdef = registry.get(op.type)
    inputs = [typed.blobs.get(b) for b in op.inputs]
    if opdef is None:
        typed.unknown_ops.append(op.index)
        _set_outputs(typed, op, [typed.net.shape_hints.get(b) for b in op.outputs], user)
        return UNKNOWN
    absent = [b for b, t in zip(op.inputs, inputs) if t is None]
    if absent:
        for blob in absent:
            _note_missing(typed, blob, producers.get(blob))
        _set_outputs(typed, op, [None] * len(op.outputs), user)
        return UNKNOWN
    if op.type in control.NESTED:  # If: its branches inferred on the outer blobs (ops/control.py)
        opdef.check_arity(len(inputs), op.label)
        outputs, features = nested.infer_nested(typed, op, infer)
        typed.blobs.update(outputs)
        return features
    params = typed.net.params
    arguments = args_key(op.args)
    # which inputs are parameters, and repeats of one (its bytes count once)
    param_inputs = tuple(op.inputs.index(b) if b in params else -1 for b in op.inputs)
    key = None if arguments is None else (op.type, tuple(inputs), param_inputs, len(op.outputs), arguments)
    bound = next((t.bound for b, t in zip(op.inputs, inputs) if t.bound and b not in params), None)
    if bound is not None and key is not None:
        key = key + (bound,)
    hit = inferred.get(key) if key is not None else None
    if hit is None:
        hit = _infer_and_cost(typed, opdef, op, inputs, counts.get(op.type), bound)
        if key is not None:
            inferred[key] = hit
    outputs, features = hit
    _set_outputs(typed, op, outputs, user)
    return features


def _bounded(outputs: list, cap: int | None, bound: str | None) -> list:
    """The outputs with their data-dependent sizes marked: an output the op itself bounds
    keeps its mark, its leading dimension cut to ``cap`` rows when given; any other
    non-scalar output of an op that reads a marked blob takes that blob's mark."""
    out = []
    for t in outputs:
        if t is not None and t.bound and cap is not None and t.shape and t.shape[0] > cap:
            t = replace(t, shape=(cap, *t.shape[1:]), bound=f"{t.bound}, priced at {cap}")
        elif t is not None and not t.bound and bound is not None and t.shape:
            t = replace(t, bound=bound)
        out.append(t)
    return out


def _infer_and_cost(typed: TypedNet, opdef, op: Op, inputs: list[TensorType], cap: int | None = None,
                    bound: str | None = None) -> tuple[list, OpFeatures]:
    """The registry's output types and cost features of one op, with its parameter bytes."""
    opdef.check_arity(len(inputs), op.label)
    outputs = _bounded(_run_infer(opdef, op, inputs), cap, bound)
    try:
        features = opdef.cost(inputs, [t for t in outputs if t is not None], op.args)
    except PlacerError:
        raise
    except Exception as e:  # as for inference: name the op rather than crash
        raise ShapeError(f"op {op.label}: cost features failed on inputs "
                         f"{_named_types(op, inputs)}: {type(e).__name__}: {e}") from e
    params = {b for b in op.inputs if b in typed.net.params}
    return tuple(outputs), replace(features, param_bytes=float(sum(typed.net.params[b].nbytes for b in params)))


def _run_infer(opdef, op: Op, inputs: list[TensorType]) -> list[TensorType | None]:
    """The registry's output types, padded with None for outputs it does not type."""
    try:
        outputs = list(opdef.infer(inputs, op.args))
    except ShapeError as e:  # the op says what does not fit; add which blobs had which shapes
        raise ShapeError(f"{e.message} (inputs: {_named_types(op, inputs)})", hint=e.hint) from e
    except PlacerError:
        raise
    except Exception as e:  # a bug in an op's inference still names the op and the shapes
        raise ShapeError(f"op {op.label}: shape inference failed on inputs "
                         f"{_named_types(op, inputs)}: {type(e).__name__}: {e}") from e
    if len(outputs) > len(op.outputs):
        outputs = outputs[:len(op.outputs)]
    return outputs + [None] * (len(op.outputs) - len(outputs))


def _named_types(op: Op, inputs: list[TensorType]) -> str:
    return ", ".join(f"'{b}' {t}" for b, t in zip(op.inputs, inputs))


def _set_outputs(typed: TypedNet, op: Op, outputs: list, user: dict[str, TensorType]) -> None:
    for name, t in zip(op.outputs, outputs):
        if t is None or (name in user and name in typed.net.shape_hints and t == typed.net.shape_hints[name]):
            t = user.get(name, t)
        typed.blobs[name] = t


def _note_missing(typed: TypedNet, blob: str, maker: Op | None) -> None:
    """Record why ``blob`` has no type, if it is a root cause (not made by an op that ran)."""
    if blob in typed.missing:
        return
    net = typed.net
    spec = f"--input {blob}=d0,d1,..."
    if maker is not None:
        if registry.get(maker.type) is None:
            typed.missing[blob] = (f"blob '{blob}' has no shape: op {maker.label} makes it and "
                                   f"placer does not know op type {maker.type}: give {spec}")
        elif typed.features[maker.index].known:
            typed.missing[blob] = (f"blob '{blob}' has no shape: op {maker.label} makes it but "
                                   f"its shape depends on input values, not shapes: give {spec}")
        return  # otherwise a consequence of an earlier missing shape, already noted
    if net.source_format == "caffe-prototxt":
        typed.missing[blob] = (f"blob '{blob}' has no shape: give {spec} (a Caffe layer's "
                               "parameter shapes follow from the net's input shapes, so --input "
                               "for the data inputs may be enough)")
    elif net.init_proto is None and net.source_format.startswith("caffe2"):
        typed.missing[blob] = (f"blob '{blob}' has no shape: give --init-net INIT "
                               f"(the init net that fills it) or {spec}")
    else:
        typed.missing[blob] = f"blob '{blob}' has no shape: give {spec}"


def missing_summary(typed: TypedNet, limit: int = 3) -> str:
    """One line naming the blobs without shape and the options that supply them."""
    names = list(typed.missing)
    shown = ", ".join(f"'{excerpt(n, 40)}'" for n in names[:limit]) + (f" and {len(names) - limit} more"
                                                                       if len(names) > limit else "")
    options = "--init-net INIT or --input NAME=d0,d1,..." if any(
        "--init-net" in m for m in typed.missing.values()) else "--input NAME=d0,d1,..."
    return f"{len(names)} blob(s) have no shape: {shown}; give {options}"


def require_complete(typed: TypedNet) -> TypedNet:
    """``typed`` itself when every blob an op needs has a shape, else a ShapeError naming the
    blobs and the options that supply them (for commands that cannot work with gaps)."""
    if typed.missing:
        raise ShapeError(f"{typed.net.path}: {missing_summary(typed)}")
    return typed


def bounded_notes(blobs: dict) -> list[str]:
    """One note per data-dependent count (``TensorType.bound``): the plan prices its blobs
    at the bound, which the data may not reach."""
    groups: dict[str, list[str]] = {}
    for name, t in blobs.items():
        if t is not None and t.bound:
            groups.setdefault(t.bound, []).append(name)
    return [f"data-dependent sizes priced at their bound ({bound}): {len(names)} blob(s), e.g. "
            f"'{names[0]}' {'x'.join(map(str, blobs[names[0]].shape))}; --proposals / --detections "
            f"price a typical count" for bound, names in groups.items()]
