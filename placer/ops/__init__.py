"""Operator families. Importing this package fills the registry (``placer.ops.registry``).

One module per family; adding a family is one line here (see CONTRIBUTING.md).
"""
from placer.ops import (  # noqa: F401
    conv, pool, norm, resize,    # spatial: Conv, ConvTranspose, pools, SpatialBN, LRN, nearest resize
    fc, elementwise, loss,       # dense: FC, MatMul, BatchMatMul, arithmetic, activations, softmax, losses
    tensor, embedding, fill, copy,  # data: shape ops, gathers, SparseLengths*, fills, copies
    detection,                   # SSD fork layers: Permute, Normalize, PriorBox, DetectionOutput
    p2p,                         # between processes: SendTensor, ReceiveTensor (and worlds, ops/p2p.py)
)
