"""Conformance cases for the dense, elementwise and loss op families, as data.

Each case: ``id``, Caffe2 ``op`` type, ``args``, ``inputs`` (specs below; values are drawn
from a generator seeded by the case id), ``ref`` (the name of an independent reference in
tests/test_ops_dense.py, computed with PyTorch's CPU build) and optionally ``tol``
(relative and absolute tolerance) and ``n_outputs`` (outputs the op declares).
"""


def randn(*shape, dtype="float32", scale=1.0):
    return {"kind": "randn", "shape": shape, "dtype": dtype, "scale": scale}


def uniform(low, high, *shape, dtype="float32"):
    return {"kind": "uniform", "shape": shape, "dtype": dtype, "low": low, "high": high}


def randint(low, high, *shape, dtype="int32"):
    """Integers in [low, high)."""
    return {"kind": "randint", "shape": shape, "dtype": dtype, "low": low, "high": high}


def nonzero_int(*shape, dtype="int32"):
    """Integers in -9..9 without 0 (divisors)."""
    return {"kind": "nonzero_int", "shape": shape, "dtype": dtype}


def prob_rows(*shape):
    """Rows (over the last dim) that are probability distributions."""
    return {"kind": "prob_rows", "shape": shape, "dtype": "float32"}


def given(values, dtype="float32"):
    return {"kind": "given", "values": values, "dtype": dtype}


NAN = float("nan")

CASES = [
    # ------------------------------------------------------------ FC family
    dict(id="fc_basic", op="FC", args={}, inputs=[randn(4, 16), randn(8, 16), randn(8)], ref="fc"),
    dict(id="fc_axis2", op="FC", args={"axis": 2}, inputs=[randn(2, 3, 4, 5), randn(7, 20), randn(7)], ref="fc"),
    dict(id="fc_axis_neg1", op="FC", args={"axis": -1}, inputs=[randn(2, 3, 8), randn(5, 8), randn(5)], ref="fc"),
    dict(id="fc_4d_input", op="FC", args={}, inputs=[randn(2, 3, 2, 2), randn(5, 12), randn(5)], ref="fc"),
    dict(id="fc_axis_w", op="FC", args={"axis_w": 1}, inputs=[randn(3, 20), randn(7, 4, 5), randn(7)], ref="fc"),
    dict(id="fc_wide", op="FC", args={}, inputs=[randn(2, 1024), randn(512, 1024), randn(512)], ref="fc", tol=1e-4),
    dict(id="fc_float64", op="FC", args={}, inputs=[randn(3, 6, dtype="float64"), randn(4, 6, dtype="float64"),
                                                    randn(4, dtype="float64")], ref="fc"),
    dict(id="fc_transposed", op="FCTransposed", args={}, inputs=[randn(4, 16), randn(16, 8), randn(8)], ref="fc_t"),
    dict(id="fc_transposed_axis2", op="FCTransposed", args={"axis": 2},
         inputs=[randn(2, 3, 4, 2), randn(8, 5), randn(5)], ref="fc_t"),
    dict(id="matmul_basic", op="MatMul", args={}, inputs=[randn(3, 4), randn(4, 5)], ref="matmul"),
    dict(id="matmul_trans_a", op="MatMul", args={"trans_a": 1}, inputs=[randn(4, 3), randn(4, 5)], ref="matmul"),
    dict(id="matmul_trans_b", op="MatMul", args={"trans_b": 1}, inputs=[randn(3, 4), randn(5, 4)], ref="matmul"),
    dict(id="matmul_trans_both", op="MatMul", args={"trans_a": 1, "trans_b": 1},
         inputs=[randn(4, 3), randn(5, 4)], ref="matmul"),
    dict(id="matmul_axis_a2", op="MatMul", args={"axis_a": 2}, inputs=[randn(2, 3, 4), randn(4, 5)], ref="matmul"),
    dict(id="matmul_axis_b2", op="MatMul", args={"axis_b": 2}, inputs=[randn(3, 4), randn(2, 2, 5)], ref="matmul"),
    dict(id="bmm_3d", op="BatchMatMul", args={}, inputs=[randn(2, 3, 4), randn(2, 4, 5)], ref="bmm"),
    dict(id="bmm_trans_both", op="BatchMatMul", args={"trans_a": 1, "trans_b": 1},
         inputs=[randn(2, 4, 3), randn(2, 5, 4)], ref="bmm"),
    dict(id="bmm_4d", op="BatchMatMul", args={}, inputs=[randn(2, 3, 4, 5), randn(2, 3, 5, 6)], ref="bmm"),
    dict(id="bmm_2d", op="BatchMatMul", args={}, inputs=[randn(3, 4), randn(4, 2)], ref="bmm"),
    dict(id="bmm_pairwise_dot", op="BatchMatMul", args={"trans_b": 1},
         inputs=[randn(8, 6, 16), randn(8, 6, 16)], ref="bmm"),
    dict(id="bmm_broadcast_2d_b", op="BatchMatMul", args={"broadcast": 1},
         inputs=[randn(2, 3, 4), randn(4, 5)], ref="bmm"),
    dict(id="bmm_broadcast_batch", op="BatchMatMul", args={"broadcast": 1},
         inputs=[randn(2, 1, 3, 4), randn(5, 4, 6)], ref="bmm"),
    dict(id="bmm_broadcast_trans", op="BatchMatMul", args={"broadcast": 1, "trans_a": 1, "trans_b": 1},
         inputs=[randn(3, 4), randn(2, 5, 3)], ref="bmm"),
    dict(id="bmm_broadcast_1d_a", op="BatchMatMul", args={"broadcast": 1},
         inputs=[randn(4), randn(2, 4, 5)], ref="bmm"),
    dict(id="bmm_broadcast_1d_b", op="BatchMatMul", args={"broadcast": 1},
         inputs=[randn(2, 3, 4), randn(4)], ref="bmm"),

    # ------------------------------------------------------------ binary arithmetic
    dict(id="add_same", op="Add", args={}, inputs=[randn(2, 3, 4), randn(2, 3, 4)], ref="add"),
    dict(id="sub_same", op="Sub", args={}, inputs=[randn(2, 3, 4), randn(2, 3, 4)], ref="sub"),
    dict(id="mul_same", op="Mul", args={}, inputs=[randn(2, 3, 4), randn(2, 3, 4)], ref="mul"),
    dict(id="div_same", op="Div", args={}, inputs=[randn(2, 3, 4), uniform(0.5, 2, 2, 3, 4)], ref="div"),
    dict(id="add_axis1", op="Add", args={"broadcast": 1, "axis": 1},
         inputs=[randn(2, 3, 4, 5), randn(3, 4)], ref="add"),
    dict(id="mul_axis_end", op="Mul", args={"broadcast": 1}, inputs=[randn(2, 3, 4, 5), randn(5)], ref="mul"),
    dict(id="add_b_last_dim_axis_minus1", op="Add", args={"broadcast": 1, "axis": -1},
         inputs=[randn(2, 3, 4, 5), randn(5)], ref="add"),
    dict(id="mul_axis_minus1", op="Mul", args={"broadcast": 1, "axis": -1},
         inputs=[randn(2, 3, 4, 5), randn(4, 5)], ref="mul"),
    dict(id="sub_axis0", op="Sub", args={"broadcast": 1, "axis": 0}, inputs=[randn(2, 3, 4, 5), randn(2)], ref="sub"),
    dict(id="add_axis_str_c", op="Add", args={"broadcast": 1, "axis_str": "C", "order": "NCHW"},
         inputs=[randn(2, 3, 4, 5), randn(3)], ref="add"),
    dict(id="add_b_trailing_one", op="Add", args={"broadcast": 1, "axis": 1},
         inputs=[randn(2, 3, 4, 5), randn(3, 4, 1)], ref="add"),
    dict(id="div_axis1", op="Div", args={"broadcast": 1, "axis": 1},
         inputs=[randn(2, 3, 4), uniform(0.5, 2, 3)], ref="div"),
    dict(id="mul_scalar_b", op="Mul", args={"broadcast": 1}, inputs=[randn(2, 3), randn(1)], ref="mul"),
    dict(id="div_numpy_scalar", op="Div", args={}, inputs=[randn(6, 5), uniform(0.5, 2, 1)], ref="div"),
    dict(id="add_numpy_both", op="Add", args={}, inputs=[randn(2, 1, 4), randn(3, 1)], ref="add"),
    dict(id="add_broadcast0_equal", op="Add", args={"broadcast": 0}, inputs=[randn(3, 4), randn(3, 4)], ref="add"),
    dict(id="div_int32_trunc", op="Div", args={}, inputs=[randint(-50, 50, 4, 6), nonzero_int(4, 6)], ref="div_trunc"),
    dict(id="add_int64", op="Add", args={}, inputs=[randint(-99, 99, 5, dtype="int64"),
                                                    randint(-99, 99, 5, dtype="int64")], ref="add"),
    dict(id="pow_exponent", op="Pow", args={"exponent": 2.0}, inputs=[randn(3, 4)], ref="pow_arg"),
    dict(id="pow_two_inputs", op="Pow", args={}, inputs=[uniform(0.5, 2, 3, 4), randn(3, 4)], ref="pow"),

    # ------------------------------------------------------------ n-ary, equal shapes
    dict(id="sum_three", op="Sum", args={}, inputs=[randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4)], ref="sum"),
    dict(id="sum_one", op="Sum", args={}, inputs=[randn(5, 2)], ref="sum"),
    dict(id="sum_int32", op="Sum", args={}, inputs=[randint(-9, 9, 7), randint(-9, 9, 7)], ref="sum"),
    dict(id="mean_three", op="Mean", args={}, inputs=[randn(2, 5), randn(2, 5), randn(2, 5)], ref="mean_n"),
    dict(id="max_three", op="Max", args={}, inputs=[randn(4, 3), randn(4, 3), randn(4, 3)], ref="max"),
    dict(id="min_two", op="Min", args={}, inputs=[randn(4, 3), randn(4, 3)], ref="min"),

    # ------------------------------------------------------------ unary
    dict(id="relu", op="Relu", args={}, inputs=[randn(2, 3, 4, 4)], ref="relu"),
    dict(id="leaky_relu_default", op="LeakyRelu", args={}, inputs=[randn(3, 7)], ref="leaky_relu"),
    dict(id="leaky_relu_alpha", op="LeakyRelu", args={"alpha": 0.2}, inputs=[randn(3, 7)], ref="leaky_relu"),
    dict(id="leaky_relu_alpha_above_one", op="LeakyRelu", args={"alpha": 1.5}, inputs=[randn(3, 7)],
         ref="leaky_relu"),
    dict(id="leaky_relu_negative_alpha", op="LeakyRelu", args={"alpha": -0.3}, inputs=[randn(3, 7)],
         ref="leaky_relu"),
    dict(id="sigmoid_wide_range", op="Sigmoid", args={}, inputs=[randn(4, 50, scale=30.0)], ref="sigmoid"),
    dict(id="sigmoid_extremes", op="Sigmoid", args={},
         inputs=[given([-1000.0, -100.0, -88.5, -30.0, 0.0, 30.0, 88.5, 1000.0])], ref="sigmoid"),
    dict(id="sigmoid_float64", op="Sigmoid", args={}, inputs=[randn(3, 9, dtype="float64", scale=50.0)],
         ref="sigmoid"),
    dict(id="tanh", op="Tanh", args={}, inputs=[randn(4, 5, scale=3.0)], ref="tanh"),
    dict(id="exp", op="Exp", args={}, inputs=[randn(4, 5)], ref="exp"),
    dict(id="log", op="Log", args={}, inputs=[uniform(0.01, 5, 4, 5)], ref="log"),
    dict(id="sqrt", op="Sqrt", args={}, inputs=[uniform(0, 5, 4, 5)], ref="sqrt"),
    dict(id="sqr", op="Sqr", args={}, inputs=[randn(4, 5)], ref="sqr"),
    dict(id="abs", op="Abs", args={}, inputs=[randn(4, 5)], ref="abs"),
    dict(id="negative", op="Negative", args={}, inputs=[randn(4, 5)], ref="negative"),
    dict(id="scale_half", op="Scale", args={"scale": 0.5}, inputs=[randn(4, 5)], ref="scale"),
    dict(id="scale_default", op="Scale", args={}, inputs=[randn(4, 5)], ref="scale"),
    dict(id="clip_both", op="Clip", args={"min": -0.5, "max": 0.5}, inputs=[randn(4, 5)], ref="clip"),
    dict(id="clip_max_only", op="Clip", args={"max": 0.25}, inputs=[randn(4, 5)], ref="clip"),
    dict(id="elu", op="Elu", args={"alpha": 0.7}, inputs=[randn(4, 5)], ref="elu"),
    dict(id="softplus", op="Softplus", args={}, inputs=[randn(4, 5, scale=20.0)], ref="softplus"),
    dict(id="logit", op="Logit", args={"eps": 1e-3}, inputs=[uniform(0, 1, 4, 5)], ref="logit"),
    dict(id="replace_nan", op="ReplaceNaN", args={"value": 7.0},
         inputs=[given([[1.0, NAN, -2.0], [NAN, 0.5, 3.0]])], ref="replace_nan"),
    dict(id="swish", op="Swish", args={}, inputs=[randn(4, 5, scale=5.0)], ref="swish"),
    dict(id="softsign", op="Softsign", args={}, inputs=[randn(4, 5, scale=5.0)], ref="softsign"),
    dict(id="thresholded_relu", op="ThresholdedRelu", args={"alpha": 0.5}, inputs=[randn(4, 5)],
         ref="thresholded_relu"),
    dict(id="reciprocal", op="Reciprocal", args={}, inputs=[uniform(0.5, 3, 4, 5)], ref="reciprocal"),
    dict(id="rsqrt", op="Rsqrt", args={}, inputs=[uniform(0.1, 3, 4, 5)], ref="rsqrt"),
    dict(id="cos", op="Cos", args={}, inputs=[randn(4, 5, scale=3.0)], ref="cos"),
    dict(id="sin", op="Sin", args={}, inputs=[randn(4, 5, scale=3.0)], ref="sin"),
    dict(id="prelu_channels", op="PRelu", args={}, inputs=[randn(2, 3, 4, 4), uniform(0, 0.5, 3)], ref="prelu"),
    dict(id="prelu_shared", op="PRelu", args={}, inputs=[randn(2, 3, 4, 4), uniform(0, 0.5, 1)], ref="prelu"),
    dict(id="prelu_slopes_outside_unit", op="PRelu", args={}, inputs=[randn(2, 3, 4, 4), uniform(-1, 2, 3)],
         ref="prelu"),
    dict(id="prelu_2d", op="PRelu", args={}, inputs=[randn(5, 6), uniform(0, 0.5, 6)], ref="prelu"),
    dict(id="prelu_nhwc", op="PRelu", args={"order": "NHWC"}, inputs=[randn(2, 4, 4, 3), uniform(0, 0.5, 3)],
         ref="prelu_nhwc"),
    dict(id="dropout_is_test_identity", op="Dropout", args={"ratio": 0.5, "is_test": 1},
         inputs=[randn(4, 6)], ref="identity"),
    dict(id="dropout_is_test_one_output", op="Dropout", args={"ratio": 0.3, "is_test": 1},
         inputs=[randn(4, 6)], ref="identity", n_outputs=1),
    dict(id="cast_float_to_int32", op="Cast", args={"to": 2}, inputs=[randn(4, 6, scale=5.0)], ref="cast"),
    dict(id="cast_float_to_int64", op="Cast", args={"to": 10}, inputs=[randn(4, 6, scale=5.0)], ref="cast"),
    dict(id="cast_int32_to_float", op="Cast", args={"to": 1}, inputs=[randint(-100, 100, 9)], ref="cast"),
    dict(id="cast_by_name_int64", op="Cast", args={"to": "INT64"}, inputs=[randint(-100, 100, 9)], ref="cast"),
    dict(id="cast_to_bool", op="Cast", args={"to": 5}, inputs=[randint(-2, 3, 9, dtype="int64")], ref="cast"),
    dict(id="cast_to_double", op="Cast", args={"to": 13}, inputs=[randn(3, 3)], ref="cast"),

    # ------------------------------------------------------------ softmax and losses
    dict(id="softmax_2d", op="Softmax", args={}, inputs=[randn(4, 10)], ref="softmax"),
    dict(id="softmax_4d_axis1", op="Softmax", args={}, inputs=[randn(2, 3, 4, 5)], ref="softmax"),
    dict(id="softmax_axis2", op="Softmax", args={"axis": 2}, inputs=[randn(2, 3, 4, 5)], ref="softmax"),
    dict(id="softmax_axis_neg1", op="Softmax", args={"axis": -1}, inputs=[randn(2, 3, 7)], ref="softmax"),
    dict(id="softmax_huge_logits", op="Softmax", args={}, inputs=[randn(3, 8, scale=300.0)], ref="softmax"),
    dict(id="swl_basic", op="SoftmaxWithLoss", args={}, inputs=[randn(6, 10), randint(0, 10, 6)], ref="swl"),
    dict(id="swl_labels_n1", op="SoftmaxWithLoss", args={}, inputs=[randn(6, 10), randint(0, 10, 6, 1)], ref="swl"),
    dict(id="swl_weights", op="SoftmaxWithLoss", args={},
         inputs=[randn(6, 10), randint(0, 10, 6), uniform(0, 2, 6)], ref="swl"),
    dict(id="swl_scale", op="SoftmaxWithLoss", args={"scale": 2.5}, inputs=[randn(5, 4), randint(0, 4, 5)], ref="swl"),
    dict(id="swl_4d_logits", op="SoftmaxWithLoss", args={}, inputs=[randn(3, 2, 2, 2), randint(0, 8, 3)], ref="swl"),
    dict(id="swl_label_prob", op="SoftmaxWithLoss", args={"label_prob": 1},
         inputs=[randn(5, 6), prob_rows(5, 6)], ref="swl_prob"),
    dict(id="swl_spatial", op="SoftmaxWithLoss", args={"spatial": 1},
         inputs=[randn(2, 4, 3, 3), randint(-1, 4, 2, 3, 3)], ref="swl_spatial"),
    dict(id="swl_spatial_weights", op="SpatialSoftmaxWithLoss", args={},
         inputs=[randn(2, 4, 3, 3), randint(-1, 4, 2, 3, 3), uniform(0, 2, 2, 3, 3)], ref="swl_spatial"),
    dict(id="label_cross_entropy", op="LabelCrossEntropy", args={}, inputs=[prob_rows(6, 5), randint(0, 5, 6)],
         ref="lce"),
    dict(id="label_cross_entropy_n1", op="LabelCrossEntropy", args={},
         inputs=[prob_rows(6, 5), randint(0, 5, 6, 1)], ref="lce"),
    dict(id="sigmoid_xent", op="SigmoidCrossEntropyWithLogits", args={},
         inputs=[randn(4, 6, scale=4.0), uniform(0, 1, 4, 6)], ref="sxe"),
    dict(id="sigmoid_xent_3d", op="SigmoidCrossEntropyWithLogits", args={},
         inputs=[randn(2, 3, 4, scale=40.0), randint(0, 2, 2, 3, 4, dtype="float32")], ref="sxe"),
    dict(id="sigmoid_xent_1d", op="SigmoidCrossEntropyWithLogits", args={},
         inputs=[randn(5), uniform(0, 1, 5)], ref="sxe"),
    dict(id="sigmoid_xent_log_d_trick", op="SigmoidCrossEntropyWithLogits", args={"log_D_trick": 1},
         inputs=[randn(4, 6, scale=4.0), randint(0, 2, 4, 6, dtype="float32")], ref="sxe_log_d"),
    dict(id="sigmoid_xent_unjoined", op="SigmoidCrossEntropyWithLogits", args={"unjoined_lr_loss": 1},
         inputs=[randn(4, 6, scale=4.0), randint(0, 2, 4, 6, dtype="float32")], ref="sxe_unjoined"),
    dict(id="averaged_loss", op="AveragedLoss", args={}, inputs=[randn(7, 3)], ref="mean"),
    dict(id="accuracy_top1", op="Accuracy", args={}, inputs=[randn(16, 10), randint(0, 10, 16)], ref="accuracy"),
    dict(id="accuracy_top5", op="Accuracy", args={"top_k": 5}, inputs=[randn(16, 10), randint(0, 10, 16)],
         ref="accuracy"),
    dict(id="accuracy_labels_n1", op="Accuracy", args={"top_k": 3}, inputs=[randn(9, 6), randint(0, 6, 9, 1)],
         ref="accuracy"),
    dict(id="squared_l2", op="SquaredL2Distance", args={}, inputs=[randn(4, 3, 2), randn(4, 3, 2)], ref="sq_l2"),
    dict(id="make_two_class", op="MakeTwoClass", args={}, inputs=[uniform(0, 1, 3, 4)], ref="two_class"),
]

# Shapes that do not fit: (id, op, args, input shapes, substrings the message must contain).
# An input is a shape (float32) or (shape, dtype).
SHAPE_ERRORS = [
    ("fc_k_mismatch", "FC", {}, [(1, 9216), (4096, 9000), (4096,)],
     ["input 0 (X) float32[1,9216]", "input 1 (W) float32[4096,9000]", "K=9216", "K=9000"]),
    ("fc_bias_mismatch", "FC", {}, [(2, 8), (4, 8), (5,)], ["input 2 (b) float32[5]", "N=4"]),
    ("fc_transposed_k", "FCTransposed", {}, [(2, 8), (4, 8), (8,)], ["K=8", "K=4"]),
    ("matmul_inner", "MatMul", {}, [(3, 4), (5, 6)], ["K=4", "K=5", "input 1 (B) float32[5,6]"]),
    ("bmm_batch_mismatch", "BatchMatMul", {}, [(2, 3, 4), (3, 4, 5)], ["same rank", "float32[3,4,5]"]),
    ("bmm_inner", "BatchMatMul", {"broadcast": 1}, [(2, 3, 4), (5, 6)], ["K=4", "K=5"]),
    ("bmm_trans_1d", "BatchMatMul", {"broadcast": 1, "trans_a": 1}, [(4,), (2, 1, 5)], ["1-d input"]),
    ("add_legacy_mismatch", "Add", {"broadcast": 1, "axis": 1}, [(2, 3, 4, 5), (4, 4)],
     ["axis=1", "input 0 (A) float32[2,3,4,5]", "input 1 (B) float32[4,4]"]),
    ("add_legacy_b_bigger", "Add", {"broadcast": 1}, [(3,), (2, 3)], ["more dims"]),
    ("mul_numpy_mismatch", "Mul", {}, [(2, 3), (4,)], ["do not broadcast", "float32[2,3]", "float32[4]"]),
    ("sum_unequal", "Sum", {}, [(2, 3), (2, 3), (3, 2)], ["same shape", "input 2 (X2) float32[3,2]"]),
    ("prelu_slope", "PRelu", {}, [(2, 3, 4, 4), (4,)], ["C=3", "input 1 (slope) float32[4]"]),
    ("swl_labels", "SoftmaxWithLoss", {}, [(6, 10), ((5,), "int32")], ["6 labels", "input 1 (label) int32[5]"]),
    ("swl_float_labels", "SoftmaxWithLoss", {}, [(6, 10), (6,)], ["must be integers", "float32[6]"]),
    ("swl_spatial_labels", "SoftmaxWithLoss", {"spatial": 1}, [(2, 4, 3, 3), (2, 3, 4)],
     ["(N, H, W) labels", "input 1 (label) float32[2,3,4]"]),
    ("swl_weights", "SoftmaxWithLoss", {}, [(6, 10), ((6,), "int32"), (3,)], ["weights need 6"]),
    ("lce_labels", "LabelCrossEntropy", {}, [(6, 5), ((6, 2), "int32")], ["6 labels"]),
    ("accuracy_float_labels", "Accuracy", {}, [(6, 5), (6,)], ["must be integers"]),
    ("sxe_shapes", "SigmoidCrossEntropyWithLogits", {}, [(4, 6), (4, 5)], ["same shape"]),
    ("accuracy_3d", "Accuracy", {}, [(2, 3, 4), (2,)], ["2-D"]),
]
