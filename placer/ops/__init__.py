"""Operator families. Importing this package fills the registry (``placer.ops.registry``).

One module per family; adding a family is one line here (see CONTRIBUTING.md).
"""
from placer.ops import (  # noqa: F401
    conv, pool, norm, resize,    # spatial: Conv, ConvTranspose, pools, SpatialBN, LRN, nearest resize
    fc, elementwise, loss,       # dense: FC, MatMul, BatchMatMul, arithmetic, activations, softmax, losses
    tensor, embedding, fill, copy,  # data: shape ops, gathers, SparseLengths*, fills, copies
    detection,                   # SSD fork layers: Permute, Normalize, PriorBox, DetectionOutput
    gradients_dense, gradients_activation, gradients_loss,  # training: FC, arithmetic, activation, loss gradients
    gradients_spatial, gradients_sparse, gradients_segment, gradients_tensor,  # training: Conv/pool/BN/LRN/
    # Dropout, sparse lengths and sorted-segment, data-movement gradients
    optimizers, learning_rate,   # training: parameter updates, iteration counters, learning rate policies
)
