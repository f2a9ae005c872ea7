"""Temporary: replaced by the precision module of the --precision work."""
from __future__ import annotations

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp")
AMP_FP32_OPS = frozenset({"Softmax", "SoftmaxWithLoss"})


def check_precision(name):
    return name


def gemm_dtype(precision, tensor_dtype, peaks):
    if precision is None or tensor_dtype != "float32":
        return tensor_dtype
    if precision == "tf32":
        return "tf32" if "tf32" in peaks else "float32"
    if precision in ("fp16", "amp"):
        return "float16"
    if precision == "bf16":
        return "bfloat16" if "bfloat16" in peaks else "float16"
    return "float32"


def byte_scale(precision, dtype, is_param, keeps_fp32=False):
    if dtype != "float32" or precision in (None, "fp32", "tf32"):
        return 1.0
    if precision == "amp" and (is_param or keeps_fp32):
        return 1.0
    return 0.5
