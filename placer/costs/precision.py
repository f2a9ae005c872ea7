"""Math modes of the GPU cost model: which dtype GPU work runs at, and how big its tensors are.

A Caffe2 net says what dtype its blobs have (float32, nearly always); the framework
running it on a GPU decides what math its convolutions and matrix products use, and
mixed precision decides what dtype activations are stored in. ``--precision`` says which:

=========  ===========================  ===========================================
precision  conv / GEMM work runs at     float32 tensors are stored and moved as
=========  ===========================  ===========================================
(auto)     the tensors' own dtype       themselves (the net's dtypes)
fp32       float32 (CUDA cores)         float32
tf32       TF32 tensor cores, where     float32 (TF32 is a math mode of float32
           the profile has a tf32 peak  data, not a storage format)
fp16       float16 tensor cores         float16, parameters too (a net cast .half())
bf16       bfloat16 tensor cores (else  bfloat16, parameters too
           float16's peak, else fp32)
amp        float16 tensor cores         activations float16; parameters float32
                                        (fp32 master weights); the outputs of ops
                                        autocast keeps in float32 (``AMP_FP32_OPS``)
                                        float32
=========  ===========================  ===========================================

"amp" is PyTorch's autocast with its default CUDA dtype, float16: on CUDA
``torch.autocast(device_type="cuda")`` casts to ``torch.float16`` unless given another
``dtype`` (pytorch.org/docs/stable/amp.html, "CUDA Ops that can autocast to float16").
bfloat16 autocast is asked for with ``--precision bf16``, which this model prices as a
bf16 net (parameters 2-byte too, as in a net cast to bfloat16; autocast would keep them
fp32).

Only float32 tensors are re-typed: a net already in float16, int8 or int32 keeps its
dtypes whatever the precision, and CPU devices always run the net's own dtypes (numpy
has no tensor cores; a CPU op's price never changes with the precision). ``resolve``
names what actually ran, for the plan document: "auto" is written as the net's own
math ("fp32" for a float32 net), and a machine with no GPU always ran the net's own.

FRAMEWORK_DEFAULTS: the math each framework runs conv and GEMM work of float32 nets in by
default on A100 / H100 / H200 (Ampere and later), checked against these pages:

- PyTorch: convolutions in TF32 (``torch.backends.cudnn.allow_tf32 = True``), matrix
  products in full fp32 since 1.12 (``torch.backends.cuda.matmul.allow_tf32 = False``):
  pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-devices (its
  example: "The flag below controls whether to allow TF32 on cuDNN. This flag defaults to
  True."), docs.pytorch.org/docs/1.12/_sources/backends.rst.txt, and the 1.12 rewrite of
  docs/source/notes/numerical_accuracy.rst (pytorch/pytorch#79537: "by default uses
  TensorFloat32" became "can use TensorFloat32").
- TensorFlow: TF32 for both since 2.4 ("TensorFloat-32 is enabled by default",
  tensorflow.org/api_docs/python/tf/config/experimental/enable_tensor_float_32_execution;
  RFC tensorflow/community#287, "Enabling TensorFloat-32 by default").
- JAX: the default precision of float32 matmul and conv on GPU uses TF32 ("By default,
  JAX leans toward speed: float32 dot products may be computed with reduced-precision
  arithmetic internally (bfloat16 on TPU, TF32 on recent GPUs)",
  docs.jax.dev/en/latest/201/precision.html; ``jax.default_matmul_precision``).
- Caffe2: cuDNN >= 8 convolutions under the default math type may use TF32 tensor cores;
  cuBLAS runs float32 GEMMs in fp32 unless the handle is set to
  ``CUBLAS_TF32_TENSOR_OP_MATH`` (``cublasMath_t``,
  docs.nvidia.com/cuda/nvmath-python/latest/bindings/generated/nvmath.bindings.cublas.Math.html),
  which Caffe2's CUDA context does not set, so its FC and MatMul stay fp32. The cuDNN half
  of this row is from the cuDNN 8 developer guide's math types
  (docs.nvidia.com/deeplearning/cudnn/archives/cudnn-891/developer-guide/index.html); no
  page found states Caffe2's choice in so many words.

So the nearest ``--precision`` to a framework's default is: PyTorch and Caffe2 between
fp32 and tf32 (tf32 convs, fp32 GEMMs: no one mode says it; fp32 is the conservative
one), TensorFlow and JAX tf32.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Mapping

import numpy as np

from placer.errors import InputError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp")

# framework -> (conv math, GEMM math) of float32 nets by default on Ampere and later GPUs
# (module docstring for the pages each row was checked against)
FRAMEWORK_DEFAULTS: dict[str, tuple[str, str]] = {
    "pytorch": ("tf32", "fp32"),      # cudnn.allow_tf32=True; cuda.matmul.allow_tf32=False since 1.12
    "tensorflow": ("tf32", "tf32"),   # TF32 on by default since 2.4
    "jax": ("tf32", "tf32"),          # default precision on GPU: TF32
    "caffe2": ("tf32", "fp32"),       # cuDNN 8 default math allows TF32; cuBLAS default math is fp32
}

# Op types whose GPU work is conv- or GEMM-shaped (gemm_dtype's domain), gradients included.
GEMM_OPS = frozenset({"Conv", "ConvTranspose", "FC", "FCTransposed", "MatMul", "BatchMatMul",
                      "ConvGradient", "ConvTransposeGradient", "FCGradient", "FCTransposedGradient",
                      "MatMulGradient", "BatchMatMulGradient"})

# Op types autocast runs in float32: the Caffe2 ops of PyTorch's "CUDA Ops that can autocast
# to float32" (pytorch.org/docs/stable/amp.html: exp, log, log10, log1p, log2, expm1, pow,
# reciprocal, rsqrt, acos, asin, cosh, sinh, erfinv, cumsum, cumprod, prod, softmax,
# log_softmax, layer_norm, group_norm, norm, normalize, cosine_similarity, the losses
# (binary_cross_entropy_with_logits, cross_entropy, nll_loss, mse_loss, l1_loss, kl_div,
# ...), sum and the reductions), and their gradients: "Backward ops run in the same type
# that autocast used for corresponding forward ops" (torch.autocast's docstring, on that page).
_AMP_FP32_FORWARD = (
    "Softmax", "LogSoftmax", "SpatialSoftmaxWithLoss",
    "SoftmaxWithLoss", "CrossEntropy", "LabelCrossEntropy", "MakeTwoClass", "SigmoidCrossEntropyWithLogits",
    "WeightedSigmoidCrossEntropyWithLogits", "AveragedLoss", "SquaredL2Distance", "L1Distance",
    "CosineSimilarity", "Normalize", "NormalizeL1", "LpNorm",
    "ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceFrontSum", "ReduceBackSum",
    "ReduceFrontMean", "ReduceBackMean", "SumElements", "SumSqrElements", "SumElementsInt", "CumSum",
    "LayerNorm", "GroupNorm",
    "Exp", "Log", "Pow", "Rsqrt", "Reciprocal", "Cosh", "Sinh", "Acos", "Asin", "Erf",
)
AMP_FP32_OPS: frozenset[str] = frozenset(_AMP_FP32_FORWARD + tuple(f"{t}Gradient" for t in _AMP_FP32_FORWARD))

PRECISION_HELP = (
    "the math GPU work is priced in (default: auto = the net's own dtypes). fp32: float32 "
    "everywhere; tf32: convs and matrix products on TF32 tensor cores where the GPU profile has "
    "a tf32 peak, tensors stay float32; fp16 / bf16: the net cast to half / bfloat16, tensors and "
    "parameters 2 bytes (copies and GPU memory halve); amp: PyTorch autocast (float16): convs and "
    "matrix products in float16, activations 2 bytes, parameters and the outputs of softmax, "
    "losses, reductions, norms, exp/log/pow kept float32. Only float32 tensors are re-typed; CPU "
    "devices always run the net's own dtypes (CPU costs never change with it)")

# Bytes per element of the dtypes a precision stores tensors in (numpy has no bfloat16).
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "tf32": 4, "object": 8}
_FLOAT32 = "float32"
_NET_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def check_precision(name: str | None) -> str | None:
    """``name`` if it is one of ``PRECISIONS``; None (auto) passes; else an error listing them."""
    if name is None or name in PRECISIONS:
        return name
    raise InputError(f"precision {str(name)[:40]!r}: not one of {', '.join(PRECISIONS)}",
                     hint="omit --precision to price the net's own dtypes")


def gemm_dtype(precision: str | None, tensor_dtype: str, peaks: Mapping[str, float]) -> str:
    """The ``peak_flops`` key conv- and GEMM-shaped GPU work (``GEMM_OPS``) of a
    ``tensor_dtype`` input runs at under ``precision`` (module docstring's table)."""
    if precision is None or tensor_dtype != _FLOAT32:
        return tensor_dtype
    if precision == "tf32":
        return "tf32" if "tf32" in peaks else _FLOAT32
    if precision in ("fp16", "amp"):
        return "float16"
    if precision == "bf16":
        return "bfloat16" if "bfloat16" in peaks else "float16" if "float16" in peaks else _FLOAT32
    return _FLOAT32


def element_dtype(precision: str | None, tensor_dtype: str, is_param: bool, keeps_fp32: bool = False) -> str:
    """The dtype a tensor is stored and moved in under ``precision``: 2-byte under fp16 /
    bf16; under amp 2-byte activations but float32 parameters (fp32 master weights, as
    autocast keeps them) and float32 outputs of ``AMP_FP32_OPS`` (``keeps_fp32``)."""
    if tensor_dtype != _FLOAT32:
        return tensor_dtype
    if precision == "fp16":
        return "float16"
    if precision == "bf16":
        return "bfloat16"
    if precision == "amp" and not is_param and not keeps_fp32:
        return "float16"
    return tensor_dtype


@lru_cache(maxsize=None)
def byte_scale(precision: str | None, dtype: str, is_param: bool, keeps_fp32: bool = False) -> float:
    """``itemsize(element_dtype(...)) / itemsize(dtype)``: 0.5 for a float32 tensor made
    2-byte, 1.0 for one left as it is."""
    stored = element_dtype(precision, dtype, is_param, keeps_fp32)
    return 1.0 if stored == dtype else _itemsize(stored) / _itemsize(dtype)


def _itemsize(dtype: str) -> int:
    size = _ITEMSIZE.get(dtype)
    return size if size is not None else np.dtype(dtype).itemsize


def scales_bytes(precision: str | None) -> bool:
    """Whether ``precision`` changes any tensor's bytes (fp16, bf16, amp)."""
    return precision in ("fp16", "bf16", "amp")


def fallback_notes(precision: str | None, gpus: Iterable[tuple[str, Mapping[str, float]]]) -> list[str]:
    """One line per GPU (name, peaks) that lacks the math ``precision`` asks for, saying
    what its conv and GEMM work was priced in instead (``gemm_dtype``'s fallbacks): TF32 on
    a pre-Ampere GPU, bfloat16 without a bfloat16 peak, float16 without tensor cores."""
    notes = []
    for name, peaks in gpus:
        got = gemm_dtype(precision, _FLOAT32, peaks)
        wanted = {"tf32": "tf32", "bf16": "bfloat16", "fp16": "float16", "amp": "float16"}.get(precision or "")
        if wanted and got != wanted:
            notes.append(f"{name} has no {wanted} peak: its conv and GEMM work is priced in {got}")
        elif wanted and got not in peaks:
            notes.append(f"{name} has no {wanted} peak: its conv and GEMM work is priced at its float32 rate")
    return sorted(set(notes))


def resolve(precision: str | None, dtypes: Iterable[str], has_gpu: bool) -> str:
    """What ran, for the plan document: the precision asked for on a machine with a GPU;
    else (auto, or no GPU) the net's own math: "fp16" / "bf16" for a net whose float
    tensors are all float16 / bfloat16, "amp" / "bf16" for a mixed-precision net (``placer
    train-net --precision amp-fp16 / amp-bf16``: half compute, float32 masters and loss),
    "fp32" otherwise."""
    if precision is not None and has_gpu:
        return precision
    floats = {d for d in dtypes if d in _NET_PRECISION}
    if len(floats) == 1:
        return _NET_PRECISION[floats.pop()]
    if floats == {"float16", "float32"}:
        return "amp"
    if floats == {"bfloat16", "float32"}:
        return "bf16"
    return "fp32"
