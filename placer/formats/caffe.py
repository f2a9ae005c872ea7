"""Caffe nets: prototxt in all three generations, `.caffemodel` weights, and the ``Net``.

- V2 files list ``layer { type: "Convolution" }``; V1 files ``layers { type: CONVOLUTION }``
  with enum types and other field numbers; V0 files nest the old parameters in
  ``layers { layer { type: "conv" kernelsize: 11 } }``. All three are brought to V2
  ``LayerParameter`` messages the way Caffe's own upgrader does (V0 "padding" layers are
  folded into the convolution or pooling that reads them), so the rest of placer sees
  one kind of layer.
- A train_val file holds both phases: ``include``/``exclude`` rules are applied against the
  net state (phase from the caller, level and stages from the file's ``state``).
- Data layers (Data, ImageData, DummyData, MemoryData, ...) and Input layers become
  external inputs; their shapes come from the file where it carries them.
- Each layer's bottoms and tops are counted against its type (Caffe's own counts,
  ``LAYER_WIRING``) before anything reads them: a layer that lost a ``top:`` line is an
  error at the layer's line, not an IndexError in the converter.
- ``.caffemodel`` files are binary NetParameters; each layer's ``blobs`` are its weights.

``formats.convert`` converts the net to Caffe2; its ``load_caffe_net`` returns the ``Net``
that the rest of placer works on.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from math import prod
from typing import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from placer.errors import NetParseError
from placer.formats.caffe_pb import (TEST, TRAIN, V1_TYPE_NAMES, LayerParameter, NetParameter, V1LayerParameter,
                                     parse_text)
from placer.formats.caffe2 import read_file_bytes
from placer.types import shape_problem

# A partial shape: None (rank unknown) or a tuple whose unknown dimensions are None.
Shape = tuple | None

# Layer types that feed the net from outside: their tops become external inputs.
DATA_LAYERS = frozenset({"Input", "Data", "ImageData", "DummyData", "MemoryData", "HDF5Data",
                         "WindowData", "AnnotatedData", "VideoData"})

# Data layers whose second top is a class label (an integer per example).
LABELLED_DATA_LAYERS = frozenset({"Data", "ImageData", "WindowData", "MemoryData"})

# Bottoms and tops a layer type takes: (min bottoms, max bottoms, min tops, max tops), None
# for no limit; Caffe's own Exact/Min/MaxNum{Bottom,Top}Blobs of each layer. Convolution
# takes N bottom/top pairs in Caffe (one set of weights); the translator converts one.
_NEURON = (1, 1, 1, 1)
LAYER_WIRING = {
    **dict.fromkeys(("ReLU", "PReLU", "Sigmoid", "TanH", "AbsVal", "BNLL", "ELU", "Exp", "Log",
                     "Power", "Threshold", "Clip", "Swish", "Dropout", "LRN", "Softmax", "Flatten",
                     "Reshape", "Tile", "BatchNorm", "InnerProduct", "Convolution", "Deconvolution",
                     "Embed", "ArgMax", "MVN", "Permute", "Normalize"), _NEURON),
    "Pooling": (1, 1, 1, 2),  # MAX pooling may name its argmax mask as a second top
    "Scale": (1, 2, 1, 1), "Bias": (1, 2, 1, 1),
    "Eltwise": (2, None, 1, 1), "Concat": (1, None, 1, 1),
    "Slice": (1, 1, 1, None), "Split": (1, 1, 1, None), "Silence": (1, None, 0, 0),
    "Accuracy": (2, 2, 1, 2), "SoftmaxWithLoss": (2, 2, 1, 2),
    **dict.fromkeys(("EuclideanLoss", "SigmoidCrossEntropyLoss", "HingeLoss", "InfogainLoss",
                     "MultinomialLogisticLoss", "ContrastiveLoss"), (2, 3, 0, 1)),  # Caffe names a missing top
    "Crop": (2, 2, 1, 1), "PriorBox": (2, 2, 1, 1), "DetectionOutput": (3, 4, 1, 1),
    "Input": (0, 0, 1, None), "DummyData": (0, 0, 1, None), "HDF5Data": (0, 0, 1, None),
    "MemoryData": (0, 0, 2, 2), "WindowData": (0, 0, 2, 2),
    **dict.fromkeys(("Data", "ImageData", "AnnotatedData", "VideoData"), (0, 0, 1, 2)),
}

# V0 lower-case type -> V1 enum name (Caffe's V0 upgrader).
_V0_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION",
    "data": "DATA", "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING",
    "relu": "RELU", "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT", "tanh": "TANH", "window_data": "WINDOW_DATA",
}


@dataclass
class CaffeNet:
    """A Caffe net after upgrading and phase filtering.

    ``layers`` are V2 LayerParameter messages in file order (data layers included);
    ``inputs`` maps each external input blob to its partial shape; ``input_dtypes`` names
    the dtype of inputs that are not float32 (labels); ``hints`` says, per input whose
    shape is incomplete, what is known and the ``--input`` that completes it.
    """

    name: str
    layers: list
    inputs: dict[str, Shape]
    input_dtypes: dict[str, str] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: str = ""
    generation: str = "V2"


# ---------------------------------------------------------------- reading files

def read_prototxt(path: str | os.PathLike):
    """Parse a prototxt file: ``(NetParameter, notes)``; NetParseError when unreadable."""
    data = read_file_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NetParseError(str(path), "not a Caffe prototxt: the file is not text",
                            hint="a binary .caffemodel goes to --weights") from None
    try:
        return parse_text(text, str(path))
    except RecursionError:  # protobuf's text parser recurses per level of braces it skips
        raise NetParseError(str(path), "not a valid Caffe prototxt: braces nested too deeply "
                                       "to parse (caffe.proto nests a few levels)") from None


def read_caffemodel(path: str | os.PathLike) -> dict[str, list[np.ndarray]]:
    """Weights of a binary ``.caffemodel``: layer name -> its blobs as float32 arrays.

    Layers of every generation are read (``layer``, V1 ``layers``, V0 nested ``layer``).
    A blob's shape is its ``shape`` field, else the legacy (num, channels, height, width).
    """
    data = read_file_bytes(path, hint="check the --weights path")
    net = NetParameter()
    try:
        net.ParseFromString(data)
    except DecodeError as e:
        raise NetParseError(str(path), f"not a binary Caffe NetParameter (.caffemodel): {e}",
                            hint="--weights takes the .caffemodel the net was trained into") from None
    weights: dict[str, list[np.ndarray]] = {}
    for layer in net.layer:
        weights[layer.name] = [blob_array(b) for b in layer.blobs]
    for v1 in net.layers:
        name = v1.name or v1.layer.name
        blobs = v1.blobs or v1.layer.blobs
        weights.setdefault(name, [blob_array(b) for b in blobs])
    if not any(weights.values()) and data and not (net.layer or net.layers):
        raise NetParseError(str(path), "no layers in the weights file",
                            hint="--weights takes a binary .caffemodel")
    return weights


def blob_array(blob) -> np.ndarray:
    """A BlobProto as a float32 array of its declared shape."""
    if blob.HasField("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:
        shape = tuple(int(d) for d in (blob.num, blob.channels, blob.height, blob.width))
    values = np.asarray(blob.data if len(blob.data) else blob.double_data, dtype=np.float32)
    if prod(shape) != values.size:
        shape = (values.size,)
    return values.reshape(shape)


# ---------------------------------------------------------------- upgrading to V2 layers

def upgrade_layers(net) -> tuple[list, str]:
    """The net's layers as V2 LayerParameter messages, and the generation it was written in."""
    if not len(net.layers):
        return list(net.layer), "V2"
    if any(v1.HasField("layer") for v1 in net.layers):
        return list(net.layer) + _upgrade_v0(net.layers), "V0"
    return list(net.layer) + [_upgrade_v1(v1) for v1 in net.layers], "V1"


def _upgrade_v1(v1):
    layer = LayerParameter(name=v1.name, type=V1_TYPE_NAMES.get(
        V1LayerParameter.LayerType.Name(v1.type), ""))
    layer.bottom.extend(v1.bottom)
    layer.top.extend(v1.top)
    layer.include.extend(v1.include)
    layer.exclude.extend(v1.exclude)
    layer.loss_weight.extend(v1.loss_weight)
    layer.blobs.extend(v1.blobs)
    for i in range(max(len(v1.param), len(v1.blobs_lr), len(v1.weight_decay))):
        spec = layer.param.add()
        if i < len(v1.param):
            spec.name = v1.param[i]
        if i < len(v1.blobs_lr):
            spec.lr_mult = v1.blobs_lr[i]
        if i < len(v1.weight_decay):
            spec.decay_mult = v1.weight_decay[i]
    for fd, value in v1.ListFields():
        if fd.name.endswith("_param") and fd.message_type is not None:
            getattr(layer, fd.name).CopyFrom(value)
    return layer


def _upgrade_v0(v1_layers) -> list:
    """V0 layers (nested ``layer {}``) to V2; "padding" layers fold into their consumer."""
    padding: dict[str, tuple[str, int]] = {}  # padding layer's top -> (its bottom, pad)
    layers = []
    for v1 in v1_layers:
        v0 = v1.layer
        if v0.type == "padding":
            padding[v1.top[0]] = (v1.bottom[0], int(v0.pad))
            continue
        layer = _upgrade_v1(_v0_to_v1(v1))
        for i, bottom in enumerate(layer.bottom):
            if bottom in padding:
                source, pad = padding[bottom]
                layer.bottom[i] = source
                if layer.type == "Convolution":
                    del layer.convolution_param.pad[:]
                    layer.convolution_param.pad.append(pad)
                elif layer.type == "Pooling":
                    layer.pooling_param.pad = pad
        layers.append(layer)
    return layers


def _v0_to_v1(v1):
    """One V0 layer as a V1 layer: the flat V0 fields moved into their *_param messages."""
    v0 = v1.layer
    out = V1LayerParameter(name=v0.name or v1.name)
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    out.include.extend(v1.include)
    out.exclude.extend(v1.exclude)
    out.blobs.extend(v0.blobs or v1.blobs)
    out.blobs_lr.extend(v0.blobs_lr or v1.blobs_lr)
    out.weight_decay.extend(v0.weight_decay or v1.weight_decay)
    kind = _V0_TYPES.get(v0.type)
    if kind is None:
        raise NetParseError("<V0 net>", f"layer '{v0.name}': unknown V0 layer type '{v0.type}'",
                            hint="upgrade the file with Caffe's upgrade_net_proto_text")
    out.type = V1LayerParameter.LayerType.Value(kind)
    has = v0.HasField
    if kind in ("CONVOLUTION", "INNER_PRODUCT"):
        p = out.convolution_param if kind == "CONVOLUTION" else out.inner_product_param
        if has("num_output"):
            p.num_output = v0.num_output
        if has("biasterm"):
            p.bias_term = v0.biasterm
        if has("weight_filler"):
            p.weight_filler.CopyFrom(v0.weight_filler)
        if has("bias_filler"):
            p.bias_filler.CopyFrom(v0.bias_filler)
    if kind == "CONVOLUTION":
        p = out.convolution_param
        if has("pad"):
            p.pad.append(v0.pad)
        if has("kernelsize"):
            p.kernel_size.append(v0.kernelsize)
        if has("group"):
            p.group = v0.group
        if has("stride"):
            p.stride.append(v0.stride)
    elif kind == "POOLING":
        p = out.pooling_param
        for src, dst in (("pool", "pool"), ("kernelsize", "kernel_size"), ("stride", "stride"),
                         ("pad", "pad")):
            if has(src):
                setattr(p, dst, getattr(v0, src))
    elif kind == "DROPOUT" and has("dropout_ratio"):
        out.dropout_param.dropout_ratio = v0.dropout_ratio
    elif kind == "LRN":
        for name in ("local_size", "alpha", "beta", "k"):
            if has(name):
                setattr(out.lrn_param, name, getattr(v0, name))
    elif kind in ("DATA", "IMAGE_DATA", "WINDOW_DATA"):
        p = {"DATA": out.data_param, "IMAGE_DATA": out.image_data_param,
             "WINDOW_DATA": out.window_data_param}[kind]
        if has("source"):
            p.source = v0.source
        if has("batchsize"):
            p.batch_size = v0.batchsize
        for src, dst in (("scale", "scale"), ("meanfile", "mean_file"), ("cropsize", "crop_size"),
                         ("mirror", "mirror")):
            if has(src):
                setattr(out.transform_param, dst, getattr(v0, src))
    elif kind == "CONCAT" and has("concat_dim"):
        out.concat_param.concat_dim = v0.concat_dim
    elif kind == "HDF5_OUTPUT" and has("hdf5_output_param"):
        out.hdf5_output_param.CopyFrom(v0.hdf5_output_param)
    return out


# ---------------------------------------------------------------- phases and states

def state_meets_rule(phase: int, level: int, stages: Sequence[str], rule) -> bool:
    """Caffe's rule test: phase equal if set, level within bounds, all stages, no not_stage."""
    if rule.HasField("phase") and rule.phase != phase:
        return False
    if rule.HasField("min_level") and level < rule.min_level:
        return False
    if rule.HasField("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    return not any(s in stages for s in rule.not_stage)


def layer_included(layer, phase: int, level: int, stages: Sequence[str]) -> bool:
    """Included when any include rule is met (or none is given and no exclude rule is met)."""
    if len(layer.include):
        return any(state_meets_rule(phase, level, stages, r) for r in layer.include)
    return not any(state_meets_rule(phase, level, stages, r) for r in layer.exclude)


def phase_number(phase: str) -> int:
    p = str(phase).lower()
    if p not in ("test", "train"):
        raise NetParseError("<phase>", f"unknown phase '{phase}'", hint="use --phase test or --phase train")
    return TEST if p == "test" else TRAIN


# ---------------------------------------------------------------- the net and its inputs

def load_caffe(path: str | os.PathLike, phase: str = "test",
               stages: Sequence[str] = (), level: int | None = None) -> CaffeNet:
    """Read, upgrade and phase-filter a prototxt; find its external inputs and their shapes."""
    net, notes = read_prototxt(path)
    layers, generation = upgrade_layers(net)
    state_stages = list(stages) or list(net.state.stage)
    state_level = level if level is not None else int(net.state.level)
    number = phase_number(phase)
    kept = [l for l in layers if layer_included(l, number, state_level, state_stages)]
    check_wiring(kept, str(path))
    caffe = CaffeNet(name=net.name, layers=kept, inputs={}, notes=list(notes), path=str(path),
                     generation=generation)
    _declared_inputs(net, caffe)
    for layer in kept:
        if layer.type in DATA_LAYERS:
            _data_layer_inputs(layer, caffe)
    if not kept:
        raise NetParseError(str(path), f"no layers in phase '{phase}'",
                            hint="check the file, or try the other --phase")
    _check_bottoms(caffe, phase)
    return caffe


def check_wiring(layers, path: str) -> None:
    """Each layer has the bottoms and tops its type takes (``LAYER_WIRING``): a layer
    that lost a ``bottom:`` or ``top:`` line is an error naming the file, the line of the
    layer and what is missing, before any converter indexes into them."""
    for layer in layers:
        counts = LAYER_WIRING.get(layer.type)
        if counts is None:
            continue
        for what, have, low, high in (("bottom", len(layer.bottom), *counts[:2]),
                                      ("top", len(layer.top), *counts[2:])):
            if low <= have and (high is None or have <= high):
                continue
            want = (f"exactly {low}" if low == high else f"at least {low}" if high is None
                    else f"{low} to {high}")
            raise layer_error(path, layer, f"has {have} {what}(s); a {layer.type} layer takes {want}",
                              hint=f"a `{what}:` line is missing or extra in that layer")


def layer_error(path: str, layer, message: str, hint: str | None = None) -> NetParseError:
    """A NetParseError at the layer's line: ``file:line: layer 'conv1' (Convolution) ...``."""
    return NetParseError(path, f"layer '{layer.name}' ({layer.type}) {message}",
                         line=layer_line(path, layer.name), hint=hint)


def _in_layer_block(text: str, at: int) -> bool:
    """Whether position ``at`` is directly inside a ``layer {`` or ``layers {`` block."""
    opened = text.rfind("{", 0, at)
    if opened < 0 or text.rfind("}", 0, at) > opened:
        return False
    return re.search(r"\blayers?\s*$", text[max(0, opened - 40):opened]) is not None


def layer_line(path: str, name: str) -> int | None:
    """The line of ``name: "<layer name>"`` in the file, if any: the first one inside a
    ``layer {`` / ``layers {`` block (a net may have the name of one of its layers), else
    the first one."""
    try:
        text = read_file_bytes(path).decode("utf-8", "replace")
    except NetParseError:
        return None
    found = list(re.finditer(r'\bname\s*:\s*["\']' + re.escape(name) + r'["\']', text))
    m = next((m for m in found if _in_layer_block(text, m.start())), found[0] if found else None)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _check_bottoms(caffe: CaffeNet, phase: str) -> None:
    """Every bottom is made by an earlier layer or is an input (Caffe's "Unknown bottom blob")."""
    available = set(caffe.inputs)
    for layer in caffe.layers:
        for bottom in layer.bottom:
            if bottom not in available:
                raise NetParseError(
                    caffe.path, f"layer '{layer.name}' ({layer.type}) reads bottom '{bottom}', which "
                                f"no earlier layer of phase '{phase}' makes and no input declares",
                    hint="fix the bottom name, or check the include/exclude rules and --phase")
        available.update(layer.top)


def _declared_inputs(net, caffe: CaffeNet) -> None:
    """``input`` with ``input_shape`` (one per input) or ``input_dim`` (four per input)."""
    dims = list(net.input_dim)
    # Caffe's Net::Init: "Must specify either input_shape OR deprecated input_dim, not both",
    # and input_dim is "deprecated 4D dimensions": four per input, in order.
    if dims and len(net.input_shape):
        raise NetParseError(caffe.path, "the net gives both input_shape and input_dim",
                            hint="keep one of them: input_shape { dim: ... } per input, or four input_dim per input")
    if dims and len(dims) != 4 * len(net.input):
        raise NetParseError(caffe.path, f"{len(dims)} input_dim value(s) for {len(net.input)} input(s): Caffe "
                            f"needs four per input (N, C, H, W)",
                            hint="give four input_dim per input, or an input_shape { dim: ... } per input")
    if len(net.input_shape) > len(net.input):
        raise NetParseError(caffe.path, f"{len(net.input_shape)} input_shape(s) for {len(net.input)} input(s)",
                            hint="give one input_shape per input")
    for i, name in enumerate(net.input):
        shape: Shape = None
        if i < len(net.input_shape):
            shape = tuple(int(d) for d in net.input_shape[i].dim)
        elif len(dims) >= 4 * (i + 1):
            shape = tuple(int(d) for d in dims[4 * i:4 * i + 4])
        if shape is not None and shape_problem(shape):
            raise NetParseError(caffe.path, f"input '{name}': {shape_problem(shape)}",
                                hint="fix its input_shape / input_dim")
        caffe.inputs[name] = shape
        if shape is None:
            caffe.hints[name] = (f"input '{name}' has no input_shape or input_dim in the file; "
                                 f"pass --input {name}=N,C,H,W")


def _data_layer_inputs(layer, caffe: CaffeNet) -> None:
    """Shapes of a data layer's tops, as far as the layer's parameters tell them."""
    tops = list(layer.top)
    shapes: list[Shape] = [None] * len(tops)
    t = layer.type
    if t == "Input":
        given = [tuple(int(d) for d in s.dim) for s in layer.input_param.shape]
        shapes = given if len(given) == len(tops) else [given[0]] * len(tops) if len(given) == 1 else shapes
    elif t == "DummyData":
        shapes = [_dummy_shape(layer.dummy_data_param, i) for i in range(len(tops))]
    elif t == "MemoryData":
        p = layer.memory_data_param
        shapes = [(p.batch_size, p.channels, p.height, p.width), (p.batch_size,)][:len(tops)]
    elif t in ("Data", "ImageData", "WindowData"):
        shapes = [_image_batch_shape(layer), (_batch_size(layer),)][:len(tops)]
    elif t == "AnnotatedData":  # its second top holds boxes, (1, 1, boxes, 8): data-dependent
        shapes = [_image_batch_shape(layer), None][:len(tops)]
    for i, (top, shape) in enumerate(zip(tops, shapes)):
        if shape is not None and shape_problem(shape):
            raise layer_error(caffe.path, layer, f"top '{top}': {shape_problem(shape)}")
        caffe.inputs[top] = shape
        if i == 1 and t in LABELLED_DATA_LAYERS:
            caffe.input_dtypes[top] = "int32"  # labels: Caffe2 losses and Accuracy take int labels
        if shape is None or None in shape:
            caffe.hints[top] = _shape_hint(layer, top, shape)
    if t in ("Data", "ImageData", "WindowData", "AnnotatedData", "HDF5Data") and len(tops) > 2:
        for top in tops[2:]:
            caffe.hints.setdefault(top, f"blob '{top}' of {t} layer '{layer.name}': shape unknown")


def _dummy_shape(p, i: int) -> Shape:
    if len(p.shape):
        return tuple(int(d) for d in p.shape[i if len(p.shape) > 1 else 0].dim)
    lists = [p.num, p.channels, p.height, p.width]
    if all(len(l) for l in lists):
        return tuple(int(l[i if len(l) > 1 else 0]) for l in lists)
    return None


def _batch_size(layer) -> int | None:
    for p, name in ((layer.data_param, "batch_size"), (layer.image_data_param, "batch_size"),
                    (layer.window_data_param, "batch_size")):
        if p.HasField(name):
            return int(getattr(p, name))
    if layer.type == "ImageData":
        return int(layer.image_data_param.batch_size)  # proto default 1
    return None


def _image_batch_shape(layer) -> Shape:
    """(batch, channels, height, width) of an image data layer; None where not derivable.

    Channels: 3/1 from ImageData is_color or force_color/force_gray, or the number of
    per-channel mean values; a mean file's channels cannot be known without reading it.
    """
    tp = layer.transform_param
    crop = tp.crop_size or layer.data_param.crop_size or layer.image_data_param.crop_size or \
        layer.window_data_param.crop_size
    h = w = crop or None
    channels = None
    if tp.force_color:
        channels = 3
    elif tp.force_gray:
        channels = 1
    elif len(tp.mean_value) > 1:
        channels = len(tp.mean_value)
    if layer.type == "ImageData":
        ip = layer.image_data_param
        channels = channels or (3 if ip.is_color else 1)
        if not crop and ip.new_height and ip.new_width:
            h, w = int(ip.new_height), int(ip.new_width)
    elif layer.type == "WindowData":
        channels = channels or 3
    return (_batch_size(layer), channels, h, w)


def _shape_hint(layer, top: str, shape: Shape) -> str:
    if shape is None:
        return (f"blob '{top}' of {layer.type} layer '{layer.name}': its shape is not in the file; "
                f"pass --input {top}=N,C,H,W")
    known = ",".join("?" if d is None else str(d) for d in shape)
    example = ",".join({0: "N", 1: "C", 2: "H", 3: "W"}.get(i, "D") if d is None else str(d)
                       for i, d in enumerate(shape))
    return (f"blob '{top}' of {layer.type} layer '{layer.name}': the file gives {known} "
            f"(channels come from a mean file or the database); pass --input {top}={example}")


def full_shape(shape: Shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


# ---------------------------------------------------------------- the Net
