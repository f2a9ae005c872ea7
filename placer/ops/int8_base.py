"""The quantized tensor of Caffe2's Int8 ops, shared by the Int8 op families.

Caffe2's ``Int8TensorCPU`` (caffe2/core/tensor_int8.h) is a tensor of ``uint8`` values
(``int32`` for a bias filled by ``Int8GivenIntTensorFill``) with one per-tensor ``scale``
and ``zero_point``: the real value of ``q`` is ``scale * (q - zero_point)``. Every op that
writes one takes the output's quantization from its own arguments (``Y_scale``,
``Y_zero_point``); the ops that read one take the input's from the tensor. The runtime
therefore carries an ``Int8Tensor`` as a blob's value: the array with its two numbers.

The shape pass sees only the array part (``TensorType`` of dtype ``uint8`` or ``int32``):
costs and memory follow the bytes; scale and zero point are values, like the data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Int8Tensor:
    """``data`` (uint8 or int32 array, numpy or cupy), ``scale`` (float32 in Caffe2,
    held as a Python float of that value) and ``zero_point`` (int)."""

    data: Any
    scale: float
    zero_point: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def ndim(self) -> int:
        return int(self.data.ndim)
