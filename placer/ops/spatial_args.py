"""Caffe2's spatial arguments (kernel, stride, pads, dilation, order, legacy_pad), parsed once.

Conv, ConvTranspose, MaxPool, AveragePool and PadImage all read the same argument family
(Caffe2's ``ConvPoolOpBase``); this module turns it into a ``Window`` and computes output
sizes the way Caffe2 does, including its legacy padding modes:

- ``kernels`` | ``kernel`` | ``kernel_h`` + ``kernel_w`` (Conv: taken from the filter when absent);
- ``strides`` | ``stride`` | ``stride_h`` + ``stride_w`` (default 1);
- ``pads`` ([pad_t, pad_l, pad_b, pad_r]) | ``pad`` | ``pad_t``/``pad_l``/``pad_b``/``pad_r`` (default 0);
- ``dilations`` | ``dilation`` | ``dilation_h`` + ``dilation_w`` (default 1);
- ``order`` "NCHW" (default) or "NHWC"; ``global_pooling`` (pools);
- ``legacy_pad``: 0 NOTSET (explicit pads, floor), 1 VALID (no pad), 2 SAME (TensorFlow-style,
  the odd pad goes to the tail), 3 CAFFE_LEGACY_POOLING (Caffe's ceil rounding: out =
  ceil((H + 2*pad_head - k) / s) + 1, minus one when pad_head > 0 and the last window would
  start at or past H + pad_head; the tail pad grows by stride per extra row, as in Caffe2).

Only 2-D images are supported (every net in the corpus is 2-D).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.errors import ArgumentError, ShapeError
from placer.types import Args, TensorType

NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING = 0, 1, 2, 3


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window: sizes per spatial dim (h, w); pads as (top, left, bottom, right)."""

    kernel: tuple[int, int] | None
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    legacy_pad: int = NOTSET
    order: str = "NCHW"
    global_pooling: bool = False

    @property
    def nchw(self) -> bool:
        return self.order == "NCHW"

    def image_dims(self, x: TensorType, op: str, what: str = "X") -> tuple[int, int, int, int]:
        """(N, C, H, W) of a 4-D input in this window's order, or a ShapeError."""
        if x.ndim != 4:
            raise ShapeError(f"op {op}: input {what} must be 4-D ({self.order}), found shape "
                             f"{'x'.join(map(str, x.shape)) or 'scalar'}",
                             hint="only 2-D images are supported")
        n, a, b, c = x.shape
        return (n, a, b, c) if self.nchw else (n, c, a, b)

    def resolve(self, h: int, w: int, op: str) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
        """Output (Ho, Wo) and the effective pads (t, l, b, r) for an H x W input."""
        if self.global_pooling:
            return (1, 1), (0, 0, 0, 0)
        (oh, pt, pb) = self._dim(h, 0, op)
        (ow, pl, pr) = self._dim(w, 1, op)
        return (oh, ow), (pt, pl, pb, pr)

    def kernel_for(self, h: int, w: int) -> tuple[int, int]:
        return (h, w) if self.global_pooling else self.kernel

    def _dim(self, size: int, d: int, op: str) -> tuple[int, int, int]:
        k, s, dil = self.kernel[d], self.stride[d], self.dilation[d]
        head, tail = self.pads[d], self.pads[d + 2]
        dk = dil * (k - 1) + 1
        if self.legacy_pad == VALID:
            head = tail = 0
            out = (size - dk) // s + 1
        elif self.legacy_pad == SAME:
            if dil != 1:
                raise ArgumentError(f"op {op}: legacy_pad SAME does not support dilation")
            target = (size + s - 1) // s
            need = max((target - 1) * s + k - size, 0)
            head, tail = need // 2, need - need // 2
            out = (size + need - dk) // s + 1
        elif self.legacy_pad == CAFFE_LEGACY_POOLING:
            out = int(math.ceil((size + 2 * head - k) / s)) + 1
            if head > 0 and (out - 1) * s >= size + head:
                out -= 1
            standard = (size + 2 * head - k) // s + 1
            tail = head + s * (out - standard)
        else:
            out = (size + head + tail - dk) // s + 1
        if out < 1 or size + head + tail < dk:
            raise ShapeError(f"op {op}: window {self.kernel[0]}x{self.kernel[1]} (dilation "
                             f"{self.dilation[d]}) does not fit an input of size {size} with pads "
                             f"{head}+{tail} (output size would be {out})")
        return out, head, tail


def shape_of(array) -> TensorType:
    """An array's shape as a TensorType, so that kernels reuse the shape checks of ``infer``."""
    return TensorType(tuple(array.shape))


def _pair(args: Args, many: str, one: str, h: str, w: str, default):
    """Caffe2's precedence: the repeated form, then the single value, then the _h/_w pair."""
    if many in args:
        vals = args.ints(many)
        if len(vals) != 2:
            raise ArgumentError(f"op {args.op}: argument '{many}' should have 2 values for a 2-D "
                                f"op, found {vals}", hint="only 2-D images are supported")
        return tuple(vals)
    if one in args:
        v = args.int(one)
        return (v, v)
    if h in args or w in args:
        return (args.int(h, default[0] if default else None), args.int(w, default[1] if default else None))
    return default


def parse_window(args: Args, *, kernel_from: tuple[int, int] | None = None,
                 pooling: bool = False) -> Window:
    """Read the spatial arguments of an op; ``kernel_from`` is the filter's kernel (Conv)."""
    order = args.str("order", "NCHW").upper()
    if order not in ("NCHW", "NHWC"):
        raise ArgumentError(f"op {args.op}: order should be NCHW or NHWC, found {order!r}")
    legacy = args.int("legacy_pad", NOTSET)
    if legacy not in (NOTSET, VALID, SAME, CAFFE_LEGACY_POOLING):
        raise ArgumentError(f"op {args.op}: legacy_pad should be 0..3, found {legacy}")
    global_pooling = pooling and args.bool("global_pooling", False)
    kernel = _pair(args, "kernels", "kernel", "kernel_h", "kernel_w", kernel_from)
    if kernel is None and not global_pooling:
        raise ArgumentError(f"op {args.op}: no kernel size given",
                            hint="set 'kernel' or 'kernel_h'/'kernel_w'")
    if "pads" in args:
        pads = tuple(args.ints("pads"))
        if len(pads) != 4:
            raise ArgumentError(f"op {args.op}: 'pads' should be [pad_t, pad_l, pad_b, pad_r], "
                                f"found {list(pads)}")
    elif "pad" in args:
        pads = (args.int("pad"),) * 4
    else:
        pads = tuple(args.int(n, 0) for n in ("pad_t", "pad_l", "pad_b", "pad_r"))
    if legacy in (VALID, SAME) and any(pads):
        raise ArgumentError(f"op {args.op}: explicit pads {list(pads)} with legacy_pad "
                            f"{'VALID' if legacy == VALID else 'SAME'}", hint="give one or the other")
    stride = _pair(args, "strides", "stride", "stride_h", "stride_w", (1, 1))
    dilation = _pair(args, "dilations", "dilation", "dilation_h", "dilation_w", (1, 1))
    for name, vals, low in (("kernel", kernel or (1, 1), 1), ("stride", stride, 1),
                            ("dilation", dilation, 1), ("pad", pads, 0)):
        if any(v is None or v < low for v in vals):
            raise ArgumentError(f"op {args.op}: {name} values should be >= {low}, found {list(vals)}")
    return Window(kernel, stride, dilation, pads, legacy, order, global_pooling)
