"""Convolutions through cuDNN where cupy provides it, and a record of which engine ran.

The GPU cost model prices a cuDNN/cuBLAS executor, so a Conv, ConvTranspose or
ConvGradient on a real GPU runs through cuDNN when it can; otherwise (numpy, no cuDNN,
arguments cuDNN cannot take, cuDNN refusing the call) the kernel runs its matmul
decomposition (``conv.conv2d`` and friends) as before. Each call notes, under its op's
label, the engine that ran and why the fallback was taken (``conv_engines``); the
runtime's RunRecord and ``placer run`` read it back (``engine_counts``).

The cupy API used (read from cupy's source, cupy/cupy tag v13.6.0, ``cupyx/cudnn.pyx``;
the functions exist unchanged from CuPy v7 to v13):

    convolution_forward(x, W, b, y, pad, stride, dilation, groups, *,
                        auto_tune, tensor_core,
                        d_layout=CUDNN_TENSOR_NCHW, w_layout=CUDNN_TENSOR_NCHW)
    convolution_backward_filter(x, gy, gW, pad, stride, dilation, groups, *,
                                deterministic, auto_tune, tensor_core,
                                d_layout=CUDNN_TENSOR_NCHW, w_layout=CUDNN_TENSOR_NCHW)
    convolution_backward_data(W, x, b, y, pad, stride, dilation, groups, *,
                              deterministic, auto_tune, tensor_core,
                              d_layout=CUDNN_TENSOR_NCHW, w_layout=CUDNN_TENSOR_NCHW)

- Every output (``y``, ``gW``) is allocated by the caller, C-contiguous, and written in
  place (beta = 0); the functions return None. ``x`` and ``W`` (and ``gy``) are made
  contiguous inside. ``b`` (or None) is added after the convolution through
  cudnnAddTensor, reshaped to (1, M, 1, 1), i.e. broadcast over the logical N, H, W of
  ``y`` whatever its layout.
- ``pad``, ``stride`` and ``dilation`` are (h, w) tuples; a 2-D convolution descriptor
  (cudnnSetConvolution2dDescriptor) takes one pad per dimension, applied at both ends:
  Caffe2's ``pad_t != pad_b`` or ``pad_l != pad_r`` cannot be given to cuDNN (Caffe2's
  own CudnnConvOp refuses them too), so those convolutions take the matmul path.
- ``groups`` goes to cudnnSetConvolutionGroupCount (cuDNN >= 7).
- ``convolution_backward_data(W, x, b, y, ...)``: ``x`` is the gradient of the forward
  output and ``y`` receives the gradient of the forward input; with ``b`` it adds a bias
  to ``y``, which makes it a transposed convolution (ConvTranspose is the data gradient
  of the convolution whose filter is ConvTranspose's (C, M/group, kH, kW)).
- ``d_layout`` / ``w_layout`` are cudnnTensorFormat_t values from ``cupy.cuda.cudnn``:
  ``CUDNN_TENSOR_NCHW = 0`` (data (N, C, H, W), filter (K, C/g, kH, kW)) and
  ``CUDNN_TENSOR_NHWC = 1`` (data (N, H, W, C), filter (K, kH, kW, C/g)) -- exactly
  Caffe2's two orders, so both tensors are handed over as they are.
- dtypes: float16 ('e', computed in float32), float32 ('f'), float64 ('d'); any other
  raises TypeError inside cupyx (``get_data_type``), so it is checked here first.
- ``tensor_core`` is "auto" | "always" | "never"; ``auto_tune=True`` benchmarks every
  algorithm once per shape (cudnnFind*), False takes cuDNN's heuristic choice
  (cudnnGet*_v7). ``deterministic=True`` keeps only deterministic backward algorithms.
  Failures raise ``cupy.cuda.cudnn.CuDNNError`` (a RuntimeError) or RuntimeError("No
  available algorithm found.").

Availability: ``cupy.cuda.cudnn`` imports in CuPy 13 even without libcudnn and then has
``available = False``; ``import cupyx.cudnn`` raises ImportError when libcudnn cannot be
loaded (a Cython module linked to it). CuPy v14 removed cuDNN altogether ("CuPy v14 no
longer supports cuDNN. All cuDNN-related functionality has been completely removed",
docs.cupy.dev upgrade guide): both imports raise ModuleNotFoundError there (checked with
cupy-cuda12x 14.2.0). cuDNN therefore needs cupy-cuda12x 13.x (placer's ``cudnn`` extra)
plus the library, which CuPy 13's install guide has wheel users fetch with
``python -m cupyx.tools.install_library --cuda 12.x --library cudnn`` (cuDNN 8.8).

Choices: ``AUTO_TUNE`` False (the heuristic: a benchmark would run inside the first
timed call of every shape), ``TENSOR_CORE`` "auto", ``DETERMINISTIC`` False (cuDNN's
fastest, as Caffe2's default ``deterministic=0``).
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from placer.ops.spatial_args import Window

CUDNN, MATMUL, NUMPY = "cudnn", "matmul", "numpy"   # the engines, as counted
NO_CUDNN = "no cuDNN"                                # how the reasons for a missing cuDNN start
AUTO_TUNE = False
TENSOR_CORE = "auto"
DETERMINISTIC = False
DTYPES = ("float16", "float32", "float64")          # cupyx.cudnn.get_data_type
# cuDNN's 4-D descriptors hold int dimensions and strides (cudnnSetTensor4dDescriptor).
MAX_ELEMENTS = 2 ** 31 - 1
HOW_TO_GET = ("cuDNN needs cupy-cuda12x 13.x: pip install 'placer[cudnn]', then "
              "python -m cupyx.tools.install_library --cuda 12.x --library cudnn")


@dataclass(frozen=True)
class CudnnApi:
    """What cupy offers for cuDNN convolutions: ``cupyx.cudnn`` and the layout constants."""

    conv: Any            # cupyx.cudnn
    nchw: int            # cupy.cuda.cudnn.CUDNN_TENSOR_NCHW
    nhwc: int            # cupy.cuda.cudnn.CUDNN_TENSOR_NHWC


_loaded: CudnnApi | str | None = None    # the api, or why it is missing; found once
_engines: dict[str, tuple[str, str]] = {}   # op label -> (engine, why the fallback)


def _is_cupy(xp) -> bool:
    """True for the real cupy module only (not numpy, not a stand-in named "cupy")."""
    return xp is sys.modules.get("cupy")


def _load() -> CudnnApi | str:
    """cupy's cuDNN, or one line saying why it is not there (looked up once)."""
    global _loaded
    if _loaded is None:
        cupy = sys.modules.get("cupy")
        version = getattr(cupy, "__version__", "?")
        try:
            from cupy.cuda import cudnn as lib
            import cupyx.cudnn as conv
        except ImportError as e:
            major = version.split(".")[0]
            removed = ", CuPy v14 removed it" if major.isdigit() and int(major) >= 14 else ""
            _loaded = f"{NO_CUDNN} (cupy {version}{removed}: {e})"
        else:
            if getattr(lib, "available", True):
                _loaded = CudnnApi(conv, int(lib.CUDNN_TENSOR_NCHW), int(lib.CUDNN_TENSOR_NHWC))
            else:
                _loaded = f"{NO_CUDNN} (cupy {version} found no libcudnn)"
    return _loaded


def _unsupported(xp, arrays, pads, extra: str = "") -> CudnnApi | str:
    """The api if cuDNN can run a convolution of ``arrays`` with Caffe2 ``pads``, else why not."""
    if getattr(xp, "__name__", "") == "numpy":
        return NUMPY
    if not _is_cupy(xp):
        return f"the array module {getattr(xp, '__name__', type(xp).__name__)!r} is not cupy"
    api = _load()
    if isinstance(api, str):
        return api
    dtypes = {str(a.dtype) for a in arrays if a is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
        return f"dtype {'/'.join(sorted(dtypes))} (cuDNN takes one of {', '.join(DTYPES)})"
    if pads[0] != pads[2] or pads[1] != pads[3]:
        return f"asymmetric pads t,l,b,r={','.join(map(str, pads))} (cuDNN pads both ends alike)"
    if any(a is not None and a.size == 0 for a in arrays):
        return "an empty tensor"
    if any(a is not None and a.size > MAX_ELEMENTS for a in arrays):
        return "a tensor of more than 2^31 - 1 elements"
    return extra or api


def _note(op: str, engine: str, why: str = "") -> None:
    _engines[op] = (engine, why)


def _fallback(op: str, why: str) -> None:
    _note(op, NUMPY if why == NUMPY else MATMUL, "" if why == NUMPY else why)


def _layouts(api: CudnnApi, nchw: bool) -> dict:
    layout = api.nchw if nchw else api.nhwc
    return {"d_layout": layout, "w_layout": layout}


def forward(xp, op: str, x, w, bias, win: Window, pads, out, group: int):
    """Caffe2 Conv through cudnn convolution_forward; None when the matmul path must run."""
    api = _unsupported(xp, (x, w, bias), pads)
    if isinstance(api, str):
        _fallback(op, api)
        return None
    n, m = x.shape[0], w.shape[0]
    y = xp.empty((n, m, *out) if win.nchw else (n, *out, m), dtype=x.dtype)
    return _call(op, y, api.conv.convolution_forward, x, w, bias, y, (pads[0], pads[1]),
                 tuple(win.stride), tuple(win.dilation), group, auto_tune=AUTO_TUNE,
                 tensor_core=TENSOR_CORE, **_layouts(api, win.nchw))


def transpose(xp, op: str, x, w, bias, win: Window, pads, out, adj, group: int):
    """Caffe2 ConvTranspose through convolution_backward_data (the data gradient of the
    convolution that maps Y back to X). cuDNN derives Y's size from X's only when adj <
    stride: (Ho + 2p - k) // s + 1 = H exactly then."""
    extra = ("" if all(a < s for a, s in zip(adj, win.stride))
             else f"adj {tuple(adj)} not below stride {tuple(win.stride)}")
    api = _unsupported(xp, (x, w, bias), pads, extra)
    if isinstance(api, str):
        _fallback(op, api)
        return None
    n, m = x.shape[0], (w.shape[1] if win.nchw else w.shape[3]) * group
    y = xp.empty((n, m, *out) if win.nchw else (n, *out, m), dtype=x.dtype)
    return _call(op, y, api.conv.convolution_backward_data, w, x, bias, y, (pads[0], pads[1]),
                 tuple(win.stride), (1, 1), group, deterministic=DETERMINISTIC, auto_tune=AUTO_TUNE,
                 tensor_core=TENSOR_CORE, **_layouts(api, win.nchw))


def gradient(xp, op: str, x, w, dy, win: Window, pads, group: int, want_dx: bool):
    """ConvGradient's (dW, dX or None) through convolution_backward_filter / _data; None
    when the matmul path must run (db stays with the caller: one reduction)."""
    api = _unsupported(xp, (x, w, dy), pads)
    if isinstance(api, str):
        _fallback(op, api)
        return None
    geometry = ((pads[0], pads[1]), tuple(win.stride), tuple(win.dilation), group)
    options = dict(deterministic=DETERMINISTIC, auto_tune=AUTO_TUNE, tensor_core=TENSOR_CORE,
                   **_layouts(api, win.nchw))
    dw = xp.empty(w.shape, dtype=w.dtype)
    if _call(op, dw, api.conv.convolution_backward_filter, x, dy, dw, *geometry, **options) is None:
        return None
    if not want_dx:
        return dw, None
    dx = xp.empty(x.shape, dtype=x.dtype)
    if _call(op, dx, api.conv.convolution_backward_data, w, dy, None, dx, *geometry, **options) is None:
        return None
    return dw, dx


def _call(op: str, result, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (which fills ``result``); None, noted, when cuDNN refuses."""
    try:
        fn(*args, **kwargs)
    except (RuntimeError, ValueError) as e:   # CuDNNError is a RuntimeError; a TypeError is a bug here
        _note(op, MATMUL, f"cuDNN refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return None
    _note(op, CUDNN)
    return result


def conv_engines() -> dict[str, tuple[str, str]]:
    """Op label -> (engine, why the fallback was taken) of every convolution run so far
    in this process (the last run of each op)."""
    return dict(_engines)


def engine_counts(labels) -> tuple[Counter, Counter]:
    """(ops per engine, fallback ops per reason) among the ops labelled ``labels``."""
    engines, reasons = Counter(), Counter()
    for label in labels:
        if label in _engines:
            engine, why = _engines[label]
            engines[engine] += 1
            if why:
                reasons[why] += 1
    return engines, reasons


def reset() -> None:
    """Forget the engines noted so far, and look cuDNN up again on the next call."""
    global _loaded
    _engines.clear()
    _loaded = None
