"""Conformance cases for the spatial op families (conv, pool, norm), as data.

Each case: ``id``, Caffe2 ``op`` type, Caffe2 ``args``, ``inputs`` (specs below; values are
drawn from a generator seeded by the case id), ``ref`` (the name of an independent PyTorch
reference in tests/test_ops_spatial.py) with ``ref_args`` written by hand in PyTorch's
terms (so the Caffe2 -> PyTorch translation is not our own code again), and optionally
``tol`` (max abs error relative to max(1, max |expected|)).

``ref_args`` keys: torch keyword arguments, plus ``pad`` = (left, right, top, bottom) applied
with F.pad before the op, ``crop`` = (top, bottom, left, right) rows/cols cut from the result,
``nhwc`` = True when X (and the filter) are in Caffe2's NHWC layout.
"""


def randn(*shape, dtype="float32"):
    return {"kind": "randn", "shape": shape, "dtype": dtype}


def positive(*shape, dtype="float32"):
    """Uniform in [0.5, 1.5): variances."""
    return {"kind": "positive", "shape": shape, "dtype": dtype}


def conv(id, x, w, args, ref_args, bias=True, tol=1e-4, op="Conv", ref="conv2d", dtype="float32"):
    """A Conv case; ``bias`` True for an (M,) bias, an int for its length, False for none."""
    m = w[0] if op == "Conv" else None
    inputs = [randn(*x, dtype=dtype), randn(*w, dtype=dtype)]
    if bias:
        inputs.append(randn(m if bias is True else bias, dtype=dtype))
    return dict(id=id, op=op, args=args, inputs=inputs, ref=ref, ref_args=ref_args, tol=tol)


def pool(id, op, x, args, ref_args):
    ref = "max_pool2d" if op == "MaxPool" else "avg_pool2d"
    return dict(id=id, op=op, args=args, inputs=[randn(*x)], ref=ref, ref_args=ref_args, tol=1e-5)


CASES = [
    # ------------------------------------------------------------ Conv
    conv("conv_3x3_pad1", (2, 8, 9, 10), (6, 8, 3, 3), {"kernel": 3, "pad": 1}, {"padding": 1}),
    conv("conv_3x3_stride2", (2, 8, 11, 11), (6, 8, 3, 3), {"kernel": 3, "stride": 2, "pad": 1},
         {"stride": 2, "padding": 1}),
    conv("conv_wide_channels", (2, 64, 9, 9), (32, 64, 3, 3), {"kernel": 3, "pad": 1}, {"padding": 1}),
    conv("conv_wide_stride2", (1, 48, 10, 12), (16, 48, 3, 3), {"kernel": 3, "stride": 2}, {"stride": 2}),
    # Big enough that the per-tap GEMMs are accumulated in blocks (by image, by positions).
    conv("conv_blocked_images", (3, 32, 40, 40), (64, 32, 3, 3), {"kernel": 3, "pad": 1}, {"padding": 1}),
    conv("conv_blocked_positions", (1, 32, 70, 70), (64, 32, 3, 3), {"kernel": 3, "pad": 1}, {"padding": 1}),
    conv("conv_blocked_group2_stride2", (1, 64, 101, 99), (64, 32, 3, 3), {"kernel": 3, "stride": 2, "group": 2},
         {"stride": 2, "groups": 2}),
    # Few channels (stacked deep GEMM), big enough to be split into blocks (by image, by positions).
    conv("conv_stacked_blocked_images", (3, 8, 64, 64), (8, 8, 5, 5), {"kernel": 5, "pad": 2}, {"padding": 2}),
    conv("conv_stacked_blocked_positions", (1, 16, 120, 120), (4, 16, 3, 3), {"kernel": 3, "pad": 1},
         {"padding": 1}),
    conv("conv_no_bias", (2, 4, 7, 7), (5, 4, 3, 3), {"kernel": 3}, {}, bias=False),
    conv("conv_1x1", (2, 64, 7, 7), (32, 64, 1, 1), {"kernel": 1}, {}),
    conv("conv_1x1_stride2", (2, 16, 7, 8), (8, 16, 1, 1), {"kernel": 1, "stride": 2}, {"stride": 2}),
    conv("conv_kernel_hw_stride_hw", (1, 3, 10, 12), (4, 3, 3, 5),
         {"kernel_h": 3, "kernel_w": 5, "stride_h": 2, "stride_w": 3}, {"stride": (2, 3)}),
    conv("conv_kernels_strides_lists", (1, 3, 10, 12), (4, 3, 2, 4),
         {"kernels": [2, 4], "strides": [1, 2], "pads": [1, 0, 1, 0]}, {"stride": (1, 2), "padding": (1, 0)}),
    conv("conv_asymmetric_pads", (2, 3, 8, 9), (4, 3, 3, 3),
         {"kernel": 3, "pad_t": 0, "pad_l": 2, "pad_b": 1, "pad_r": 0}, {"pad": (2, 0, 0, 1)}),
    conv("conv_pads_list_stride2", (1, 5, 9, 9), (4, 5, 3, 3),
         {"kernel": 3, "stride": 2, "pads": [1, 0, 2, 1]}, {"stride": 2, "pad": (0, 1, 1, 2)}),
    conv("conv_dilation2", (2, 4, 12, 11), (3, 4, 3, 3), {"kernel": 3, "dilation": 2, "pad": 2},
         {"dilation": 2, "padding": 2}),
    conv("conv_dilation_hw_stride", (1, 4, 15, 13), (3, 4, 3, 2),
         {"kernel_h": 3, "kernel_w": 2, "dilation_h": 3, "dilation_w": 2, "stride": 2},
         {"dilation": (3, 2), "stride": 2}),
    conv("conv_group2", (2, 8, 9, 9), (6, 4, 3, 3), {"kernel": 3, "pad": 1, "group": 2},
         {"padding": 1, "groups": 2}),
    conv("conv_group4_1x1", (2, 12, 6, 6), (8, 3, 1, 1), {"kernel": 1, "group": 4}, {"groups": 4}),
    conv("conv_group3_wide", (1, 96, 7, 7), (48, 32, 3, 3), {"kernel": 3, "pad": 1, "group": 3},
         {"padding": 1, "groups": 3}),
    conv("conv_depthwise", (2, 6, 11, 11), (6, 1, 3, 3), {"kernel": 3, "pad": 1, "group": 6},
         {"padding": 1, "groups": 6}),
    conv("conv_depthwise_stride2", (2, 8, 12, 12), (8, 1, 3, 3), {"kernel": 3, "stride": 2, "pad": 1, "group": 8},
         {"stride": 2, "padding": 1, "groups": 8}),
    conv("conv_depthwise_multiplier2", (1, 4, 9, 9), (8, 1, 3, 3), {"kernel": 3, "pad": 1, "group": 4},
         {"padding": 1, "groups": 4}),
    # Large enough that the depthwise multiply-add is split into cache blocks (by group, by image).
    conv("conv_depthwise_blocked_groups", (1, 8, 200, 200), (8, 1, 3, 3), {"kernel": 3, "pad": 1, "group": 8},
         {"padding": 1, "groups": 8}),
    conv("conv_depthwise_blocked_images", (3, 16, 40, 40), (16, 1, 3, 3), {"kernel": 3, "pad": 1, "group": 16},
         {"padding": 1, "groups": 16}),
    conv("conv_alexnet_conv1", (1, 3, 59, 59), (8, 3, 11, 11), {"kernel": 11, "stride": 4}, {"stride": 4}),
    conv("conv_kernel_from_filter", (1, 3, 8, 8), (4, 3, 3, 3), {"pad": 1}, {"padding": 1}),
    conv("conv_legacy_valid", (1, 3, 9, 9), (4, 3, 3, 3), {"kernel": 3, "stride": 2, "legacy_pad": 1}, {"stride": 2}),
    conv("conv_legacy_same_s1", (1, 3, 9, 8), (4, 3, 3, 3), {"kernel": 3, "legacy_pad": 2}, {"padding": 1}),
    # SAME on 10 with k3 s2: target 5, need 1: head 0, tail 1 (Caffe2 puts the odd pad last).
    conv("conv_legacy_same_s2", (1, 3, 10, 10), (4, 3, 3, 3), {"kernel": 3, "stride": 2, "legacy_pad": 2},
         {"stride": 2, "pad": (0, 1, 0, 1)}),
    conv("conv_nhwc", (2, 7, 8, 5), (6, 3, 3, 5), {"kernel": 3, "pad": 1, "order": "NHWC"},
         {"padding": 1, "nhwc": True}),
    conv("conv_nhwc_wide_stride2", (1, 9, 9, 40), (8, 3, 3, 40), {"kernel": 3, "stride": 2, "order": "NHWC"},
         {"stride": 2, "nhwc": True}),
    conv("conv_nhwc_group2", (1, 6, 6, 8), (6, 3, 3, 4), {"kernel": 3, "group": 2, "pad": 1, "order": "NHWC"},
         {"padding": 1, "groups": 2, "nhwc": True}),
    conv("conv_nhwc_depthwise", (2, 7, 7, 5), (5, 3, 3, 1), {"kernel": 3, "group": 5, "order": "NHWC"},
         {"groups": 5, "nhwc": True}),
    conv("conv_nhwc_depthwise_blocked", (3, 70, 70, 16), (16, 3, 3, 1),
         {"kernel": 3, "pad": 1, "group": 16, "order": "NHWC"}, {"padding": 1, "groups": 16, "nhwc": True}),
    conv("conv_nhwc_blocked", (1, 70, 70, 32), (64, 3, 3, 32), {"kernel": 3, "pad": 1, "order": "NHWC"},
         {"padding": 1, "nhwc": True}),
    conv("conv_nhwc_1x1", (2, 5, 5, 16), (8, 1, 1, 16), {"kernel": 1, "order": "NHWC"}, {"nhwc": True}),
    conv("conv_float64", (1, 4, 6, 6), (3, 4, 3, 3), {"kernel": 3}, {}, tol=1e-10, dtype="float64"),
    # ------------------------------------------------------------ ConvTranspose (filter C, M/group, kH, kW)
    conv("convT_stride2_pad1", (2, 4, 5, 5), (4, 6, 3, 3), {"kernel": 3, "stride": 2, "pad": 1},
         {"stride": 2, "padding": 1}, bias=6, op="ConvTranspose", ref="conv_transpose2d"),
    conv("convT_adj", (1, 4, 5, 6), (4, 3, 3, 3), {"kernel": 3, "stride": 2, "pad": 1, "adj": 1},
         {"stride": 2, "padding": 1, "output_padding": 1}, bias=3, op="ConvTranspose", ref="conv_transpose2d"),
    conv("convT_k4_s2_group2", (2, 4, 4, 4), (4, 3, 4, 4), {"kernel": 4, "stride": 2, "pad": 1, "group": 2},
         {"stride": 2, "padding": 1, "groups": 2}, bias=6, op="ConvTranspose", ref="conv_transpose2d"),
    conv("convT_no_bias_hw", (1, 3, 4, 5), (3, 2, 2, 3), {"kernel_h": 2, "kernel_w": 3, "stride_h": 2, "stride_w": 1},
         {"stride": (2, 1)}, bias=False, op="ConvTranspose", ref="conv_transpose2d"),
    conv("convT_nhwc", (1, 5, 4, 4), (4, 3, 3, 2), {"kernel": 3, "stride": 2, "pad": 1, "order": "NHWC"},
         {"stride": 2, "padding": 1, "nhwc": True}, bias=2, op="ConvTranspose", ref="conv_transpose2d"),
    conv("convT_legacy_valid_adj", (1, 3, 4, 4), (3, 2, 3, 3), {"kernel": 3, "stride": 2, "legacy_pad": 1, "adj": 1},
         {"stride": 2, "output_padding": 1}, bias=2, op="ConvTranspose", ref="conv_transpose2d"),
    # Asymmetric pads crop the full transposed output: rows [1, H-2), cols [0, W-1).
    conv("convT_asymmetric_pads", (2, 3, 5, 4), (3, 4, 3, 3), {"kernel": 3, "stride": 2, "pads": [1, 0, 2, 1]},
         {"stride": 2, "crop": (1, 2, 0, 1)}, bias=4, op="ConvTranspose", ref="conv_transpose2d"),
    # ------------------------------------------------------------ MaxPool
    pool("maxpool_2x2", "MaxPool", (2, 3, 8, 8), {"kernel": 2, "stride": 2}, {"kernel_size": 2, "stride": 2}),
    pool("maxpool_3x3_s2_p1", "MaxPool", (2, 3, 9, 9), {"kernel": 3, "stride": 2, "pad": 1},
         {"kernel_size": 3, "stride": 2, "padding": 1}),
    # Caffe ceil mode: 112 k3 s2 -> 56 (Caffe2's floor rule gives 55).
    pool("maxpool_ceil_112", "MaxPool", (1, 2, 112, 112), {"kernel": 3, "stride": 2, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    pool("maxpool_ceil_13_p0", "MaxPool", (1, 2, 13, 13), {"kernel": 3, "stride": 2, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    pool("maxpool_ceil_13_p1", "MaxPool", (1, 2, 13, 13), {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    # 14 k3 s2 p1: ceil gives 8 (floor 7); the extra window reaches past H + pad.
    pool("maxpool_ceil_14_p1", "MaxPool", (1, 2, 14, 14), {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    # 5 k2 s2 p1: ceil gives 4 but that window would start at H + pad, so 3.
    pool("maxpool_ceil_clipped", "MaxPool", (1, 2, 5, 5), {"kernel": 2, "stride": 2, "pad": 1, "legacy_pad": 3},
         {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}),
    pool("maxpool_asym_pads", "MaxPool", (1, 3, 7, 8), {"kernel": 3, "stride": 2, "pads": [0, 1, 1, 0]},
         {"kernel_size": 3, "stride": 2, "pad": (1, 0, 0, 1)}),
    pool("maxpool_dilation", "MaxPool", (1, 2, 11, 11), {"kernel": 3, "dilation": 2, "stride": 2},
         {"kernel_size": 3, "dilation": 2, "stride": 2}),
    pool("maxpool_global", "MaxPool", (2, 3, 7, 5), {"global_pooling": 1}, {"kernel_size": (7, 5)}),
    pool("maxpool_nhwc_ceil", "MaxPool", (2, 9, 9, 3), {"kernel": 2, "stride": 2, "legacy_pad": 3, "order": "NHWC"},
         {"kernel_size": 2, "stride": 2, "ceil_mode": True, "nhwc": True}),
    pool("maxpool_hw", "MaxPool", (1, 2, 9, 10), {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 3},
         {"kernel_size": (3, 2), "stride": (2, 3)}),
    # ------------------------------------------------------------ AveragePool (Caffe2 default: count_include_pad=0)
    pool("avgpool_2x2", "AveragePool", (2, 3, 8, 8), {"kernel": 2, "stride": 2}, {"kernel_size": 2, "stride": 2}),
    pool("avgpool_pad_exclude", "AveragePool", (2, 3, 9, 9), {"kernel": 3, "stride": 2, "pad": 1},
         {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    pool("avgpool_pad_include", "AveragePool", (2, 3, 9, 9), {"kernel": 3, "stride": 2, "pad": 1, "count_include_pad": 1},
         {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": True}),
    pool("avgpool_ceil_112", "AveragePool", (1, 2, 112, 112), {"kernel": 3, "stride": 2, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "ceil_mode": True, "count_include_pad": False}),
    pool("avgpool_ceil_14_p1_exclude", "AveragePool", (1, 2, 14, 14),
         {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}),
    # With count_include_pad=1 Caffe2 divides by k*k; the legacy tail pad is 1 + 2 = 3.
    pool("avgpool_ceil_14_p1_include", "AveragePool", (1, 2, 14, 14),
         {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3, "count_include_pad": 1},
         {"kernel_size": 3, "stride": 2, "pad": (1, 3, 1, 3)}),
    pool("avgpool_ceil_6_k3_s3_p1", "AveragePool", (1, 2, 6, 6), {"kernel": 3, "stride": 3, "pad": 1, "legacy_pad": 3},
         {"kernel_size": 3, "stride": 3, "padding": 1, "ceil_mode": True, "count_include_pad": False}),
    pool("avgpool_asym_exclude", "AveragePool", (1, 2, 7, 8), {"kernel": 3, "stride": 2, "pads": [1, 0, 0, 2]},
         {"kernel_size": 3, "stride": 2, "pad": (0, 2, 1, 0), "count_pad_from_mask": True}),
    pool("avgpool_global", "AveragePool", (2, 4, 7, 7), {"global_pooling": 1}, {"kernel_size": 7}),
    pool("avgpool_global_nhwc", "AveragePool", (2, 5, 6, 4), {"global_pooling": 1, "order": "NHWC"},
         {"kernel_size": (5, 6), "nhwc": True}),
    pool("avgpool_nhwc_pad", "AveragePool", (1, 8, 8, 3), {"kernel": 3, "pad": 1, "order": "NHWC"},
         {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False, "nhwc": True}),
    # ------------------------------------------------------------ SpatialBN
    dict(id="bn_test", op="SpatialBN", args={"is_test": 1, "epsilon": 1e-5},
         inputs=[randn(2, 4, 5, 6), randn(4), randn(4), randn(4), positive(4)], ref="batch_norm",
         ref_args={"training": False, "eps": 1e-5}, tol=1e-5),
    dict(id="bn_test_eps_nhwc", op="SpatialBN", args={"is_test": 1, "epsilon": 1e-3, "order": "NHWC"},
         inputs=[randn(2, 5, 6, 4), randn(4), randn(4), randn(4), positive(4)], ref="batch_norm",
         ref_args={"training": False, "eps": 1e-3, "nhwc": True}, tol=1e-5),
    dict(id="bn_train", op="SpatialBN", args={"is_test": 0, "epsilon": 1e-5, "momentum": 0.9},
         inputs=[randn(3, 4, 5, 5), randn(4), randn(4), randn(4), positive(4)], ref="batch_norm",
         ref_args={"training": True, "momentum": 0.1, "eps": 1e-5}, tol=1e-5),
    dict(id="bn_train_nhwc", op="SpatialBN", args={"epsilon": 1e-4, "momentum": 0.8, "order": "NHWC"},
         inputs=[randn(2, 3, 4, 6), randn(6), randn(6), randn(6), positive(6)], ref="batch_norm",
         ref_args={"training": True, "momentum": 0.2, "eps": 1e-4, "nhwc": True}, tol=1e-5),
    # ------------------------------------------------------------ LRN (torch alpha == Caffe2 alpha: both / size)
    dict(id="lrn_alexnet", op="LRN", args={"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0},
         inputs=[randn(2, 8, 5, 5)], ref="lrn", ref_args={"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 1.0}),
    dict(id="lrn_strong", op="LRN", args={"size": 3, "alpha": 0.5, "beta": 0.6, "bias": 2.0},
         inputs=[randn(1, 6, 4, 3)], ref="lrn", ref_args={"size": 3, "alpha": 0.5, "beta": 0.6, "k": 2.0}),
    # Even size: Caffe2 starts the window (size-1)//2 = 1 channel before (torch: size//2 = 2).
    dict(id="lrn_even_size", op="LRN", args={"size": 4, "alpha": 0.3, "beta": 0.75},
         inputs=[randn(1, 7, 3, 3)], ref="lrn", ref_args={"size": 4, "alpha": 0.3, "beta": 0.75, "k": 1.0,
                                                          "front": 1}),
    dict(id="lrn_nhwc", op="LRN", args={"size": 5, "alpha": 0.2, "beta": 0.75, "bias": 1.5, "order": "NHWC"},
         inputs=[randn(2, 3, 4, 9)], ref="lrn", ref_args={"size": 5, "alpha": 0.2, "beta": 0.75, "k": 1.5,
                                                          "nhwc": True}),
    # ------------------------------------------------------------ PadImage
    dict(id="pad_constant", op="PadImage", args={"pad": 2, "value": 1.5},
         inputs=[randn(1, 2, 4, 5)], ref="pad", ref_args={"pad": (2, 2, 2, 2), "mode": "constant", "value": 1.5}),
    dict(id="pad_reflect", op="PadImage", args={"pad_t": 1, "pad_l": 2, "pad_b": 3, "pad_r": 0, "mode": "reflect"},
         inputs=[randn(2, 2, 5, 4)], ref="pad", ref_args={"pad": (2, 0, 1, 3), "mode": "reflect"}),
    dict(id="pad_edge_nhwc", op="PadImage", args={"pads": [1, 2, 2, 1], "mode": "edge", "order": "NHWC"},
         inputs=[randn(1, 4, 4, 3)], ref="pad", ref_args={"pad": (2, 1, 1, 2), "mode": "replicate", "nhwc": True}),
]

# Inputs that do not fit: (id, op, args, input shapes, words the message must contain).
SHAPE_ERRORS = [
    ("conv_channels", "Conv", {"kernel": 3}, [(1, 8, 9, 9), (4, 6, 3, 3)], ["W", "6", "C=8"]),
    ("conv_group_channels", "Conv", {"kernel": 3, "group": 2}, [(1, 8, 9, 9), (4, 8, 3, 3)], ["group=2", "C/group=4"]),
    ("conv_kernel_vs_filter", "Conv", {"kernel": 5}, [(1, 3, 9, 9), (4, 3, 3, 3)], ["kernel", "(3, 3)", "(5, 5)"]),
    ("conv_bias", "Conv", {"kernel": 3}, [(1, 3, 9, 9), (4, 3, 3, 3), (5,)], ["bias", "(4,)"]),
    ("conv_too_small", "Conv", {"kernel": 5}, [(1, 3, 3, 3), (4, 3, 5, 5)], ["does not fit", "size 3"]),
    ("conv_3d_input", "Conv", {"kernel": 3}, [(3, 9, 9), (4, 3, 3, 3)], ["4-D"]),
    ("convT_channels", "ConvTranspose", {"kernel": 3}, [(1, 4, 5, 5), (3, 2, 3, 3)], ["C=4"]),
    ("pool_too_small", "MaxPool", {"kernel": 4}, [(1, 3, 3, 3)], ["does not fit"]),
    ("bn_scale", "SpatialBN", {"is_test": 1}, [(2, 4, 3, 3), (3,), (4,), (4,), (4,)], ["scale", "(4,)"]),
]
