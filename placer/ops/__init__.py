"""Operator families. Importing this package fills the registry (``placer.ops.registry``).

One module per family; adding a family is one line here (see CONTRIBUTING.md).
"""
from placer.ops import (  # noqa: F401
    conv, pool, norm, resize,    # spatial: Conv, ConvTranspose, pools, SpatialBN, LRN, nearest resize
    fc, elementwise, loss,       # dense: FC, MatMul, BatchMatMul, arithmetic, activations, softmax, losses
    tensor, embedding, fill, copy,  # data: shape ops, gathers, SparseLengths*, fills, copies
    collective,                  # NCCL and Gloo collectives, all-to-all, common worlds
    detection,                   # SSD fork layers: Permute, Normalize, PriorBox, DetectionOutput
    detection_proposals,         # Caffe2 Faster R-CNN: GenerateProposals, FPN proposal collect/distribute
    detection_boxes,             # Detectron boxes: BBoxTransform, BoxWithNMSLimit
    control,                     # IsEmpty, If (nested then_net / else_net)
    roi,                         # RoI pooling: RoIAlign, RoIAlignGradient, RoIPool
    transformer,                 # LayerNorm, Gelu and their gradients
    half,                        # float16 casts, fills, FP16MomentumSGDUpdate; placer's bfloat16 casts
    layout,                      # NCHW2NHWC, NHWC2NCHW
    int8_conv,                   # Caffe2 Int8 (QNNPACK): Quantize/Dequantize, Int8 fills, Conv, ConvTranspose, FC
    int8_tensor,                 # quantized Int8 (QNNPACK) elementwise, pools, softmax, data movement
    logical,                     # comparisons, And/Or/Xor/Not, IsNaN, Where, SumElements, SumSqrElements
    p2p,                         # between processes: SendTensor, ReceiveTensor (and worlds, ops/p2p.py)
    # training: gradient ops (FC and arithmetic, activations, losses, Conv/pools/SpatialBN/LRN/
    # Dropout, sparse lengths and scatters, sorted segments, data movement), parameter updates
    # with iteration counters, learning-rate policies
    gradients_dense, gradients_activation, gradients_loss, gradients_spatial,
    gradients_sparse, gradients_segment, gradients_tensor, optimizers, learning_rate,
    fp32_momentum,               # FP32MomentumSGDUpdate (momentum SGD with weight decay, CUDA in Caffe2)
    reduce,                      # ReduceMean/Sum/Max/Min/L1/L2, HardSigmoid, Erf (what the ONNX backend writes)
)
