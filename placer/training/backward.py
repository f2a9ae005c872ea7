"""The backward pass of a net, as ``core.Net.AddGradientOperators`` of Caffe2 writes it.

Caffe2 plays the forward ops once to give every blob write a version (SSA), seeds each loss
with ``ConstantFill([loss]) -> <loss>_autogen_grad`` (value 1.0), then walks the ops
backwards asking the gradient registry (``gradients.py``) for each op whose outputs have a
gradient. Two rules shape the result:

- **Accumulation.** A blob version read by several ops gets one gradient from each. When the
  walk reaches the first reader (the last to contribute), the contributions are summed: the
  first keeps its name, each later one is renamed ``_<name>_autosplit_<k>`` (k from 0) in its
  gradient op, and ``Sum(...) -> <name>`` follows (a contribution that names the target
  goes first, so the sum is in place). Sparse contributions are not summed but concatenated:
  every one is renamed, and ``Concat(axis=0)`` writes ``<base>_indices_concat`` and
  ``<base>_values_concat``. A mix of sparse and dense contributions is an error. The sum ops
  take the first contributor's device option plus ``extra_info: "is_auto_gen_sum_ops:1"``.
- **Versions.** A gradient op may read a forward blob only at the version the forward op
  saw; an in-place op that overwrote it makes the gradient wrong, and Caffe2 refuses. So
  does this module, naming the blob.

The order of ops matches Caffe2's except among the sum ops of one forward op (Caffe2 visits
that op's inputs in hash order; here in input order).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from placer.training.gradient_registry import GradientError, GradientSlice, make_op, op_label
from placer.training.gradients import gradient_for_op

AUTOGEN_GRAD_SUFFIX = "_autogen_grad"
IS_AUTO_GEN_SUM_OPS_TAG = "is_auto_gen_sum_ops"
ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = "only_keep_is_auto_gen_sum_ops_tag"


class OverwrittenBlobError(GradientError):
    """A gradient needs a blob version that a later (in-place) op overwrote."""

    def __init__(self, message: str, blob: str, version: int):
        super().__init__(message, hint="write the later op's result to a new blob")
        self.blob, self.version = blob, version


@dataclass
class _Contribution:
    """One gradient contribution to a blob version: the op and output index that write it
    (None when an op passes an existing gradient through, as Sum does), for a dense gradient;
    for a sparse one, the writers of its indices and of its values."""

    gradient: object  # str or GradientSlice
    device_option: object
    op: object = None
    index: int = 0
    indices_op: object = None
    indices_index: int = 0
    values_op: object = None
    values_index: int = 0

    @property
    def sparse(self) -> bool:
        return isinstance(self.gradient, GradientSlice)


class BackwardPass:
    """The SSA bookkeeping of Caffe2's ``IR`` for one forward op list."""

    def __init__(self, ops: Sequence):
        self.ssa: list[tuple[object, dict, dict]] = []
        self.input_usages = defaultdict(lambda: defaultdict(list))
        self.frontier: dict[str, int] = defaultdict(int)
        self.gradient_frontier: dict[str, int] = {}
        self.contributions = defaultdict(lambda: defaultdict(list))
        for op in ops:
            self._play(op)
        for op in ops:
            if op.type == "StopGradient" and op.output[0] not in self.input_usages:
                raise GradientError(f"op {op_label(op)}: StopGradient's output '{op.output[0]}' is "
                                    "read by no op", hint="give StopGradient the same input and output")

    def _play(self, op) -> None:
        in_versions = {}
        for blob in op.input:
            in_versions[blob] = self.frontier[blob]
            self.input_usages[blob][self.frontier[blob]].append(len(self.ssa))
        out_versions = {}
        for blob in op.output:
            if blob in self.frontier:
                self.frontier[blob] += 1
            out_versions[blob] = self.frontier[blob]
        self.ssa.append((op, in_versions, out_versions))

    # ------------------------------------------------------------ the walk

    def run(self, losses: Sequence[str]) -> tuple[list, dict]:
        """``(gradient ops, {blob: gradient})`` for the given loss blobs."""
        for y in losses:
            self.gradient_frontier[y] = self.frontier[y]
            self.input_usages[y][self.frontier[y]].append(len(self.ssa))
        to_grad: dict = {}
        grad_ops = []
        for y in dict.fromkeys(losses):
            seed = make_op("ConstantFill", [y], [y + AUTOGEN_GRAD_SUFFIX], value=1.0)
            grad_ops.append(seed)
            to_grad[y] = seed.output[0]
            self.contributions[y][self.frontier[y]].append(
                _Contribution(seed.output[0], seed.device_option, op=seed, index=0))
        for index in reversed(range(len(self.ssa))):
            new_grads, ops = self._gradients_of(index, to_grad)
            to_grad.update(new_grads)
            grad_ops += ops
            sum_ops, summed = self._accumulate(index)
            to_grad.update(summed)
            grad_ops += sum_ops
        return grad_ops, {blob: g for blob, g in to_grad.items() if g is not None}

    def _gradients_of(self, index: int, to_grad: dict) -> tuple[dict, list]:
        op, in_versions, _ = self.ssa[index]
        g_output = [to_grad.get(name) for name in op.output]
        if all(g is None for g in g_output):
            return {}, []
        ops, g_input = gradient_for_op(op, g_output)
        self._record(index, ops, g_output, g_input)
        new = {}
        for name, grad in zip(op.input, g_input):
            if grad is not None or name not in to_grad or name in op.output:
                new[name] = grad
        return new, ops

    def _record(self, index: int, grad_ops: list, g_output: list, g_input: list) -> None:
        """Check what each gradient op reads; note which op writes each input gradient."""
        op, in_versions, out_versions = self.ssa[index]
        local: set[str] = set()
        sparse_parts = defaultdict(list)
        for grad_op in grad_ops:
            for blob in grad_op.input:
                self._check_input(blob, index, g_output, local)
            local.update(grad_op.output)
            for i, out in enumerate(grad_op.output):
                k = _gradient_index(g_input, out)
                if k is None:
                    continue
                name = op.input[k]
                version = in_versions[name]
                g = g_input[k]
                if isinstance(g, GradientSlice):
                    part = (_Contribution(g, grad_op.device_option, indices_op=grad_op, indices_index=i)
                            if g.indices == out else
                            _Contribution(g, grad_op.device_option, values_op=grad_op, values_index=i))
                    sparse_parts[(name, version)].append(part)
                else:
                    self.contributions[name][version].append(
                        _Contribution(g, grad_op.device_option, op=grad_op, index=i))
        for (name, version), parts in sparse_parts.items():
            merged = parts[0]
            for part in parts[1:]:
                merged.indices_op = merged.indices_op or part.indices_op
                merged.indices_index += part.indices_index
                merged.values_op = merged.values_op or part.values_op
                merged.values_index += part.values_index
            self.contributions[name][version].append(merged)
        for k, g in enumerate(g_input):
            if not g:
                continue
            name = op.input[k]
            names = (g.indices, g.values) if isinstance(g, GradientSlice) else (g,)
            if not any(n in local for n in names):
                self.contributions[name][in_versions[name]].append(_Contribution(g, op.device_option))
        for k, g in enumerate(g_input):
            if g is not None:
                self.gradient_frontier[op.input[k]] = in_versions[op.input[k]]

    def _check_input(self, blob: str, index: int, g_output: list, local: set) -> None:
        op, in_versions, out_versions = self.ssa[index]
        k = _gradient_index(g_output, blob)
        if k is not None:
            original = op.output[k]
            if out_versions[original] != self.gradient_frontier.get(original):
                raise GradientError(f"op {op_label(op)}: its gradient reads '{blob}', the gradient of "
                                    f"version {out_versions[original]} of '{original}', but the "
                                    "gradient at hand is of another version",
                                    hint="the blob is written by more than one op")
        elif blob in out_versions:
            if self.frontier[blob] != out_versions[blob]:
                raise OverwrittenBlobError(
                    f"op {op_label(op)}: its gradient needs output '{blob}' as this op wrote it, "
                    "and a later op overwrites it", blob, out_versions[blob])
        elif blob in in_versions:
            if self.frontier[blob] != in_versions[blob]:
                raise OverwrittenBlobError(
                    f"op {op_label(op)}: its gradient needs input '{blob}' as this op read it, and "
                    "a later op (an in-place one?) overwrites it", blob, in_versions[blob])
        elif blob not in local:
            raise GradientError(f"op {op_label(op)}: its gradient reads '{blob}', which is neither "
                                "a blob of the op nor made by its other gradient ops")

    # ------------------------------------------------------------ accumulation

    def _accumulate(self, index: int) -> tuple[list, dict]:
        op, in_versions, _ = self.ssa[index]
        sum_ops, summed = [], {}
        for name in dict.fromkeys(op.input):
            version = in_versions[name]
            usage = self.input_usages[name][version]
            if len(usage) <= 1 or index != usage[0]:
                continue
            contributions = self.contributions[name][version]
            if not self._needs_sum(name, contributions):
                continue
            ops, g = self._sum_ops(name, contributions)
            sum_ops += ops
            summed[name] = g
        return sum_ops, summed

    def _needs_sum(self, name: str, contributions: list) -> bool:
        if len({c.sparse for c in contributions}) > 1:
            raise GradientError(f"blob '{name}' gets both sparse and dense gradients; Caffe2 "
                                "cannot sum them", hint="read it through ops of one kind")
        if len(contributions) < 2:
            return False
        options = [c.device_option for c in contributions]  # an unset option counts as the CPU
        if any(not _same_device(o, options[0]) for o in options[1:]):
            raise GradientError(f"blob '{name}': its gradient contributions come from ops on "
                                "different devices", hint="place the readers of the blob on one device")
        return True

    def _sum_ops(self, name: str, contributions: list) -> tuple[list, object]:
        base = _sum_output_name(name, contributions)
        if contributions[0].sparse:
            ops, g = _sparse_sum(base, contributions)
        else:
            ops, g = _dense_sum(base, contributions)
        _set_sum_device_option(ops, contributions)
        return ops, g


def _dense_sum(base: str, contributions: list) -> tuple[list, str]:
    inputs, renamed, first = [], 0, True
    for c in contributions:
        if c.op is None:
            _check_sum_conflict(base, c.gradient)
            inputs.append(c.gradient)
        elif first:
            first = False
            inputs.append(c.op.output[c.index])
        else:
            inputs.append(_autosplit(c.op, c.index, renamed))
            renamed += 1
    if base in inputs:  # Sum is in place only on its first input
        k = inputs.index(base)
        inputs[0], inputs[k] = inputs[k], inputs[0]
    return [make_op("Sum", inputs, [base])], base


def _sparse_sum(base: str, contributions: list) -> tuple[list, GradientSlice]:
    indices, values, renamed_i, renamed_v = [], [], 0, 0
    for c in contributions:
        if c.indices_op is not None:
            indices.append(_autosplit(c.indices_op, c.indices_index, renamed_i))
            renamed_i += 1
        else:
            _check_sum_conflict(base, c.gradient.indices)
            indices.append(c.gradient.indices)
        if c.values_op is not None:
            values.append(_autosplit(c.values_op, c.values_index, renamed_v))
            renamed_v += 1
        else:
            _check_sum_conflict(base, c.gradient.values)
            values.append(c.gradient.values)
    ops = [make_op("Concat", indices, [f"{base}_indices_concat", f"{base}_indices_concat_split"], axis=0),
           make_op("Concat", values, [f"{base}_values_concat", f"{base}_values_concat_split"], axis=0)]
    return ops, GradientSlice(f"{base}_indices_concat", f"{base}_values_concat")


def _autosplit(grad_op, index: int, k: int) -> str:
    """Rename output ``index`` of a gradient op to ``_<name>_autosplit_<k>``."""
    grad_op.output[index] = f"_{grad_op.output[index]}_autosplit_{k}"
    return grad_op.output[index]


def _check_sum_conflict(base: str, gradient: str) -> None:
    if str(base) == str(gradient):
        raise GradientError(f"gradient '{gradient}': a pass-through gradient has the name of the "
                            "sum it belongs to")


def _sum_output_name(name: str, contributions: list) -> str:
    """The name of the first contribution an op writes (sparse: less its suffix)."""
    for c in contributions:
        if not c.sparse and c.op is not None:
            return c.op.output[c.index]
        if c.sparse and c.indices_op is not None:
            return c.indices_op.output[c.indices_index].removesuffix("_indices")
        if c.sparse and c.values_op is not None:
            return c.values_op.output[c.values_index].removesuffix("_values")
    return f"{name}_grad"


def _set_sum_device_option(ops: list, contributions: list) -> None:
    keep_tag_only = any(f"{ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG}:1" in c.device_option.extra_info
                        for c in contributions)
    for op in ops:
        if not keep_tag_only:
            op.device_option.CopyFrom(contributions[0].device_option)
        op.device_option.extra_info.append(f"{IS_AUTO_GEN_SUM_OPS_TAG}:1")


def _same_device(a, b) -> bool:
    """Caffe2's ``device_option_equal`` (node name and seed ignored)."""
    if not a.device_type or not b.device_type:
        return not a.device_type and not b.device_type
    return a.device_id == b.device_id


def _gradient_index(grads: Sequence, name: str) -> int | None:
    for i, g in enumerate(grads):
        if g == name or isinstance(g, GradientSlice) and name in (g.indices, g.values):
            return i
    return None


# ---------------------------------------------------------------- making in-place ops out of place

def out_of_place(netdef, losses: Sequence[str]) -> list[str]:
    """Rename the outputs of in-place ops whose overwriting Caffe2's backward pass refuses.

    Caffe runs ``ReLU`` then ``Dropout`` in place on one blob, or BatchNorm in place on a
    convolution's output; the gradient of the earlier op needs the value the later op
    overwrote, so Caffe2 cannot differentiate the net as written. Each such overwriting op
    gets a new output, ``<blob>_<op name>``, and every later reference follows it. Returns
    one line per renamed blob.
    """
    renamed = []
    for _ in range(len(netdef.op) + 1):
        try:
            BackwardPass(list(netdef.op)).run(list(losses))
            return renamed
        except OverwrittenBlobError as e:
            k = _writer_of_version(netdef.op, e.blob, e.version + 1)
            if k is None:
                raise
            op = netdef.op[k]
            new = _fresh_name(netdef, f"{e.blob}_{op.name or k}")
            for later in netdef.op[k:]:
                _rename(later.output, e.blob, new)
                if later is not op:
                    _rename(later.input, e.blob, new)
            _rename(netdef.external_output, e.blob, new)
            renamed.append(f"op {op_label(op)} writes '{new}' instead of overwriting '{e.blob}'")
    raise GradientError(f"net '{netdef.name}': in-place ops could not be made out of place")


def _writer_of_version(ops, blob: str, version: int) -> int | None:
    """The op that writes ``version`` of ``blob``, counting versions as ``BackwardPass._play``."""
    frontier: dict[str, int] = {}
    for k, op in enumerate(ops):
        for b in op.input:
            frontier.setdefault(b, 0)
        for b in op.output:
            frontier[b] = frontier[b] + 1 if b in frontier else 0
            if b == blob and frontier[b] == version:
                return k
    return None


def _fresh_name(netdef, base: str) -> str:
    used = {b for op in netdef.op for b in (*op.input, *op.output)} | set(netdef.external_input)
    name, n = base, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    return name


def _rename(field, old: str, new: str) -> None:
    for i, name in enumerate(field):
        if name == old:
            field[i] = new


# ---------------------------------------------------------------- public entry points

def backward_ops(forward_ops: Sequence, losses: Sequence[str]) -> tuple[list, dict]:
    """``(gradient ops, {blob: gradient name or GradientSlice})`` for ``losses``."""
    return BackwardPass(forward_ops).run(list(losses))


def add_gradient_ops(netdef, losses: Sequence[str]) -> dict:
    """Append the backward pass of ``netdef`` for ``losses`` to it (as Caffe2's
    ``net.AddGradientOperators(losses)``) and return the blob -> gradient map."""
    produced = {b for op in netdef.op for b in op.output}
    for loss in losses:
        if loss not in produced:
            raise GradientError(f"net '{netdef.name}': no op writes the loss blob '{loss}'",
                                hint="name a blob an op of the net outputs")
    grad_ops, grads = backward_ops(list(netdef.op), losses)
    netdef.op.extend(grad_ops)
    return grads
