"""Kernel-level GPU times: cuBLAS GEMMs and cuDNN convolutions as tiles in waves over the SMs.

A datasheet roofline (flops at a fixed share of peak) misses what decides a GPU kernel's
time: a GEMM runs as output tiles, one thread block each, in waves over the streaming
multiprocessors, so a product whose tiles fill 81 of 80 SMs takes two waves; a tile's
inner loop over K pays a prologue and epilogue; a small tile cannot feed its multipliers;
a skinny product with a long K is split along K; and cuDNN picks, per shape and pass, among
algorithms whose work differs by 2-4x (Winograd's reduced multiplications for 3x3 stride-1
layers). This module models those, with a handful of constants per GPU and math class
fitted to DeepBench's published kernel times (``bench/fit_gpu_kernels.py``; the fitted
values live in the GPU profiles, ``kernel_model``, with their source).

GEMM (``gemm_seconds``), for C (M, N) += A (M, K) B (K, N), ``batch`` of them:

- a tile shape (tm, tn) from the math class's list; ``occupancy`` = max(1, 128*128 /
  (tm tn)) blocks share an SM (at most 4); tiles = ceil(M/tm) ceil(N/tn) x batch;
- split-K by s in 1, 2, 4, ... 32 (only while K/s >= 64): tiles x s blocks, each a K/s
  slice, plus a pass that reads the s partial products and writes C;
- one block's time = (K/s + ``k_overhead``) x max(tm tn, ``knee`` (tm + tn)) x 2 /
  (per-SM rate / occupancy), the per-SM rate being peak x ``efficiency`` / SMs: the loop
  over K is bound by the multiply-adds of the tile, or, for a tile whose multiply-adds per
  loaded element (tm tn / (tm + tn)) are under ``knee``, by feeding it;
- waves = ceil(blocks / (SMs x occupancy)); compute = waves x block time;
- memory = (A + B + C bytes, once) / achieved bandwidth;
- time = ``fixed_s`` + max(compute, memory) + split-K's pass, at the best (tile, split),
  as cuBLAS's heuristics aim to pick.

Convolution (``conv_seconds``): per pass (forward, backward-data, backward-filter) the
algorithms cuDNN offers for the shape, each its own work count, the fastest taken (what
``cudnnFind`` / benchmark mode does):

- ``implicit_gemm``: the GEMM view of the convolution (forward M = N P Q, N = K, K = C R S
  per group; backward-data M = N H W, N = C, K = K R S / (stride_h stride_w);
  backward-filter M = K, N = C R S, K = N P Q), at the pass's ``conv_*`` constants (the
  im2col gather is done on the fly). Its memory traffic is the tensors' own bytes plus the
  share ``conv_<pass>.reread`` of the image's re-reads for its other filter taps where
  that constant is fitted (the forward pass; tensor-core backward-data), else the GEMM
  view's operands (the expanded image);
- ``gemm`` for 1x1 stride-1 unpadded convolutions: a plain GEMM;
- ``winograd`` (3x3, stride 1, no groups, SIMT math): F(4x4, 3x3) non-fused, 36 batched
  GEMMs over 4x4 output tiles (M = N ceil(P/4) ceil(Q/4), K = C, N = K), 4x fewer
  multiplications than direct, plus the transforms' memory passes (the 6x6 transformed
  input and output tiles written and read back once), at ``winograd`` efficiency;
- ``fft`` (filters of 5x5 and more, stride 1, SIMT math): the image and filters padded to
  the FFT size, transformed (memory passes), multiplied as a complex batched GEMM per
  frequency (4 real multiply-adds per complex one), transformed back, at ``fft``
  efficiency;
- ``depthwise`` (one channel per group): cuDNN's direct kernel, bound by its bytes.

Math classes: ``simt`` (float32 on CUDA cores), ``tensor`` (float16/bfloat16/TF32 on tensor
cores), ``int8`` (int8 tensor cores / dp4a). A float16 product runs on tensor cores only
when its GEMM K and N are multiples of 8 (cuDNN 7 / cuBLAS 10's rule for tensor-op math,
so a 3-channel input layer does not); otherwise on CUDA cores, at the ``simt`` class's
constants and the float32 peak, and DeepBench shows such layers far slower still (the
``unaligned`` factor).

Memory-bound ops (``memory_seconds``): bytes at the achieved bandwidth (a STREAM-like
figure, not the datasheet's), plus one launch overhead per kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

MATH_CLASSES = ("simt", "tensor", "int8")
# Tile shapes (rows x columns of C per thread block) each math class's kernels use:
# cuBLAS's SIMT SGEMM kernels (128x128 down to 32x32, "sgemm_128x128", "sgemm_32x32_sliced1x4"
# in nvprof traces) and its tensor-core HMMA kernels (up to 256x128).
TILES = {
    "simt": ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32)),
    "tensor": ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64)),
    "int8": ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64)),
}
SPLITS = (1, 2, 4, 8, 16, 32)
MIN_SPLIT_K = 64          # a split-K slice is at least this deep
FULL_TILE = 128 * 128     # the tile that fills an SM alone
MAX_OCCUPANCY = 4         # smaller tiles: at most this many blocks per SM
TENSOR_ALIGN = 8          # tensor-op math needs GEMM K and N multiples of this
WINOGRAD_TILE = 4         # F(4x4, 3x3): 4x4 outputs per 6x6 input tile
WINOGRAD_POINTS = 36
PASSES = ("forward", "backward_data", "backward_filter")
CONV_FACTORS = ("conv_forward", "conv_backward_data", "conv_backward_filter", "winograd", "fft", "unaligned")


@dataclass(frozen=True)
class ClassParams:
    """Fitted constants of one math class on one GPU (see the module docstring)."""

    efficiency: float          # share of the class's peak a full tile reaches at large K
    k_overhead: float          # K steps a tile pays besides its loop (prologue, epilogue)
    knee: float                # multiply-adds per loaded element under which a tile is feed-bound
    fixed_s: float             # seconds per kernel besides its tiles (launch, setup)
    conv: Mapping[str, float] = field(default_factory=dict)   # CONV_FACTORS -> efficiency relative to GEMM

    def factor(self, name: str) -> float:
        return float(self.conv.get(name, 1.0))

    def for_algorithm(self, name: str) -> "ClassParams":
        """The constants one convolution algorithm's GEMMs run with: the GEMM's, with the
        algorithm's own efficiency factor (``name``, e.g. ``conv_forward`` or
        ``winograd``) and, where fitted, its own K overhead, knee and fixed time
        (``name.k_overhead`` ...): cuDNN's kernels are not cuBLAS's."""
        def own(field_name, default):
            return float(self.conv.get(f"{name}.{field_name}", default))
        return ClassParams(efficiency=self.efficiency * self.factor(name),
                           k_overhead=own("k_overhead", self.k_overhead), knee=own("knee", self.knee),
                           fixed_s=own("fixed_s", self.fixed_s), conv=self.conv)

    def for_pass(self, pass_: str) -> "ClassParams":
        """The constants a convolution pass's implicit GEMM runs with: the GEMM's, with
        the pass's own efficiency factor (``conv_<pass>``) and, where fitted, its own
        K overhead, knee and fixed time (``conv_<pass>.k_overhead`` ...): cuDNN's kernels
        are not cuBLAS's."""
        return self.for_algorithm(f"conv_{pass_}")


@dataclass(frozen=True)
class GpuKernelModel:
    """A GPU's kernel-model facts: SMs, achieved bandwidth, peaks, fitted classes."""

    sm_count: int
    achieved_bandwidth_bytes_per_s: float
    peaks: Mapping[str, float]                  # dtype key (float32, tf32, float16, bfloat16, int8) -> FLOP/s
    classes: Mapping[str, ClassParams]
    source: str = ""

    def peak(self, key: str) -> float:
        return float(self.peaks.get(key) or self.peaks["float32"])


def math_class(key: str) -> str:
    """The math class a peak key runs in: float32 on CUDA cores, int8, else tensor cores."""
    if key == "int8":
        return "int8"
    return "tensor" if key in ("tf32", "float16", "bfloat16") else "simt"


# ------------------------------------------------------------------------ GEMM

def gemm_seconds(gpu: GpuKernelModel, key: str, m, n, k, batch=1, in_bytes: float = 4.0,
                 out_bytes: float = 4.0, extra_bytes=0.0, efficiency=1.0, aligned=None, max_split: int = SPLITS[-1],
                 params: ClassParams | None = None, unaligned_factor: float = 1.0, memory_bytes=None):
    """Seconds of ``batch`` GEMMs (M, N, K) (numpy arrays broadcast) in peak key ``key``
    (``math_class``); ``extra_bytes`` more memory traffic; ``efficiency`` scales the tile
    rate (a conv algorithm's factor); ``max_split`` caps split-K (1: none, as cuDNN's
    forward and backward-data kernels). ``aligned``: for a tensor-core key, whether K and
    N are multiples of 8 (default: computed); where not, the product runs on tensor cores
    with K and N padded up to multiples of 8, at ``unaligned_factor`` (1 for a GEMM, whose
    operands are padded as DeepBench's benchmark pads them; a convolution's ``unaligned``
    constant: cuDNN's kernels for 1- and 3-channel input layers run far below the padded
    rate). Returns (seconds, tile index, split) arrays."""
    m, n, k, batch = (np.asarray(v, float) for v in (m, n, k, batch))
    cls = math_class(key)
    if cls != "simt":
        if aligned is None:
            aligned = (np.mod(k, TENSOR_ALIGN) == 0) & (np.mod(n, TENSOR_ALIGN) == 0)
        aligned = np.broadcast_to(np.asarray(aligned, bool), np.broadcast(m, n, k, batch).shape)
        if not aligned.all():
            unal = unaligned_factor
            kp = np.where(aligned, k, np.ceil(k / TENSOR_ALIGN) * TENSOR_ALIGN)
            np_ = np.where(aligned, n, np.ceil(n / TENSOR_ALIGN) * TENSOR_ALIGN)
            eff = np.asarray(efficiency, float) * np.where(aligned, 1.0, unal)
            return _gemm(gpu, cls, gpu.peak(key), m, np_, kp, batch, in_bytes, out_bytes, extra_bytes, eff,
                         max_split, params, memory_bytes)
    return _gemm(gpu, cls, gpu.peak(key), m, n, k, batch, in_bytes, out_bytes, extra_bytes, efficiency, max_split,
                 params, memory_bytes)


def _gemm(gpu: GpuKernelModel, cls: str, peak: float, m, n, k, batch, in_bytes, out_bytes, extra_bytes,
          efficiency, max_split, params=None, memory_bytes=None):
    """The tile and split-K search of ``gemm_seconds``, every (tile, split) at once: arrays
    of shape (tiles, splits, *problems); the first best (tile, split) in list order wins
    ties, as a loop over them would pick."""
    p = params or gpu.classes[cls]
    shape = np.broadcast(m, n, k, batch).shape
    m, n, k, batch = (np.broadcast_to(np.asarray(v, float), shape) for v in (m, n, k, batch))
    sm = float(gpu.sm_count)
    rate = np.broadcast_to(peak * p.efficiency * np.asarray(efficiency, float) / sm, shape)   # FLOP/s of one SM
    bw = gpu.achieved_bandwidth_bytes_per_s
    if memory_bytes is None:
        memory_bytes = (in_bytes * (m * k + k * n) + out_bytes * m * n) * batch
    memory = np.broadcast_to(np.asarray(memory_bytes, float) / bw + np.asarray(extra_bytes, float) / bw, shape)
    tiles = np.array(TILES[cls], float)                                     # (T, 2)
    tm, tn = tiles[:, 0], tiles[:, 1]
    occ = np.clip(np.floor(FULL_TILE / (tm * tn)), 1, MAX_OCCUPANCY)
    per_block = 2.0 * np.maximum(tm * tn, p.knee * (tm + tn)) * occ         # FLOP per k step x occupancy
    splits = np.array([sp for sp in SPLITS if sp <= max_split], float)      # (S,)
    extra = (slice(None),) + (None,) * len(shape)
    tm_, tn_, occ_, blk_ = (v[extra][:, None] for v in (tm, tn, occ, per_block))   # (T, 1, ...)
    sp = splits[(None, slice(None)) + (None,) * len(shape)]                         # (1, S, ...)
    count = np.ceil(m / tm_) * np.ceil(n / tn_) * batch                             # (T, 1, ...)
    waves = np.ceil(count * sp / (sm * occ_))
    compute = waves * (k / sp + p.k_overhead) * blk_ / rate
    t = np.maximum(compute, memory)
    # split-K: the partial products written and read back, then C written, one more kernel;
    # a split's slice is at least MIN_SPLIT_K deep
    t = np.where(sp > 1, t + (2.0 * sp + 1.0) * 4.0 * m * n * batch / bw + p.fixed_s, t)
    t = np.where((sp > 1) & (k / sp < MIN_SPLIT_K), np.inf, t)
    flat = t.reshape(len(tm) * len(splits), *shape)
    pick = np.argmin(flat, axis=0)
    best = np.take_along_axis(flat, pick[None], axis=0)[0]
    return p.fixed_s + best, pick // len(splits), splits[pick % len(splits)].astype(int)


# ----------------------------------------------------------------- convolution

@dataclass(frozen=True)
class ConvShape:
    """One convolution: N images of C x H x W, K filters of (C/groups) x R x S."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad_h: int = 0
    pad_w: int = 0
    stride_h: int = 1
    stride_w: int = 1
    groups: int = 1
    dilation_h: int = 1
    dilation_w: int = 1

    @property
    def out(self) -> tuple[int, int]:
        eff_r = (self.r - 1) * self.dilation_h + 1
        eff_s = (self.s - 1) * self.dilation_w + 1
        return ((self.h + 2 * self.pad_h - eff_r) // self.stride_h + 1,
                (self.w + 2 * self.pad_w - eff_s) // self.stride_w + 1)

    @property
    def macs(self) -> float:
        p, q = self.out
        return float(self.n * self.k * p * q * (self.c // self.groups) * self.r * self.s)


def conv_algorithms(gpu: GpuKernelModel, key: str, shape, pass_: str, elt: float) -> dict[str, np.ndarray]:
    """Seconds of each algorithm cuDNN offers for a pass, over ``shape``: a ``ConvShape``
    or a ``ConvShapes`` of arrays (one value per convolution; inf where an algorithm does
    not apply)."""
    sh = shape if isinstance(shape, ConvShapes) else ConvShapes.of([shape])
    p, q = sh.out
    g = sh.groups
    cg, kg = sh.c // g, sh.k // g
    cls = math_class(key)
    # tensor-op math needs the channel counts (not the GEMM's K = C R S) multiples of 8
    aligned = (np.mod(cg, TENSOR_ALIGN) == 0) & (np.mod(kg, TENSOR_ALIGN) == 0) if cls != "simt" else None
    x_bytes = elt * sh.n * sh.c * sh.h * sh.w
    y_bytes = elt * sh.n * sh.k * p * q
    w_bytes = elt * sh.k * cg * sh.r * sh.s
    bw = gpu.achieved_bandwidth_bytes_per_s
    out: dict[str, np.ndarray] = {}
    own = gpu.classes[cls].for_pass(pass_)
    if pass_ == "forward":
        dims = (sh.n * p * q, kg, cg * sh.r * sh.s)
    elif pass_ == "backward_data":
        # each input position meets R S / (stride_h stride_w) filter taps on average
        taps = np.maximum(sh.r * sh.s / (sh.stride_h * sh.stride_w), 1.0)
        dims = (sh.n * sh.h * sh.w, cg, kg * taps)
    else:
        dims = (kg, cg * sh.r * sh.s, sh.n * p * q)
    depthwise = (cg == 1) & (g > 1)
    split = SPLITS[-1]
    unal = gpu.classes[cls].factor(f"conv_{pass_}.unaligned")
    # the tensors' own bytes, the image read again for a share of its filter taps (what the
    # caches miss of the implicit im2col: ``conv_<pass>.reread``)
    taps_all = sh.r * sh.s / (sh.stride_h * sh.stride_w)
    name = f"conv_{pass_}.reread"
    if name in gpu.classes[cls].conv:
        image = x_bytes if pass_ != "backward_data" else y_bytes
        traffic = x_bytes + y_bytes + w_bytes + image * gpu.classes[cls].factor(name) * np.maximum(taps_all - 1.0, 0.0)
    else:   # the GEMM view's operands, the expanded image among them
        traffic = None
    implicit = gemm_seconds(gpu, key, *dims, batch=g, in_bytes=elt, out_bytes=elt, aligned=aligned,
                            max_split=split, params=own, unaligned_factor=unal, memory_bytes=traffic)[0]
    out["implicit_gemm"] = np.where(depthwise, np.inf, implicit)
    # depthwise: cuDNN's direct kernel, one pass over its tensors (dX's pass reads W and dY, writes dX)
    simt = gpu.classes.get("simt", own)
    direct = simt.fixed_s + np.maximum((x_bytes + y_bytes + w_bytes) / bw,
                                       2.0 * sh.macs / (gpu.peak("float32") * simt.efficiency))
    out["depthwise"] = np.where(depthwise, direct, np.inf)
    pointwise = (sh.r == 1) & (sh.s == 1) & (sh.stride_h == 1) & (sh.stride_w == 1) & (sh.pad_h == 0) & (sh.pad_w == 0)
    if pass_ == "forward" and pointwise.any():   # a 1x1 forward is a plain GEMM (cuDNN's backward passes are its own)
        plain_gemm = gemm_seconds(gpu, key, *dims, batch=g, in_bytes=elt, out_bytes=elt, aligned=aligned,
                                  max_split=split, unaligned_factor=unal)[0]
        out["gemm"] = np.where(pointwise & ~depthwise, plain_gemm, np.inf)
    plain = (g == 1) & (sh.stride_h == 1) & (sh.stride_w == 1) & (sh.dilation_h == 1) & (sh.dilation_w == 1)
    if cls == "simt":
        wino = plain & (((sh.r == 3) & (sh.s == 3)) | ((sh.r == 5) & (sh.s == 5)))
        if wino.any():
            out["winograd"] = np.where(wino, _winograd(gpu, key, sh, pass_, elt, x_bytes, y_bytes), np.inf)
        fft = plain & (np.minimum(sh.r, sh.s) >= 5) & ~wino
        if fft.any():
            out["fft"] = np.where(fft, _fft(gpu, key, sh, pass_, elt), np.inf)
    return out


@dataclass(frozen=True)
class ConvShapes:
    """Convolutions as arrays, one entry per convolution (the fields of ``ConvShape``)."""

    n: np.ndarray
    c: np.ndarray
    h: np.ndarray
    w: np.ndarray
    k: np.ndarray
    r: np.ndarray
    s: np.ndarray
    pad_h: np.ndarray
    pad_w: np.ndarray
    stride_h: np.ndarray
    stride_w: np.ndarray
    groups: np.ndarray
    dilation_h: np.ndarray
    dilation_w: np.ndarray

    @classmethod
    def of(cls, shapes) -> "ConvShapes":
        names = [f.name for f in cls.__dataclass_fields__.values()]
        return cls(**{name: np.array([getattr(s, name) for s in shapes], np.int64) for name in names})

    @property
    def out(self):
        eff_r = (self.r - 1) * self.dilation_h + 1
        eff_s = (self.s - 1) * self.dilation_w + 1
        return ((self.h + 2 * self.pad_h - eff_r) // self.stride_h + 1,
                (self.w + 2 * self.pad_w - eff_s) // self.stride_w + 1)

    @property
    def macs(self):
        p, q = self.out
        return (self.n * self.k * p * q * (self.c // self.groups) * self.r * self.s).astype(float)


def _winograd(gpu, key, sh: ConvShapes, pass_: str, elt: float, x_bytes, y_bytes):
    """Non-fused Winograd: F(4x4, 3x3) for 3x3 filters, F(2x2, 5x5) for 5x5 (both 6x6
    transformed tiles, the two cuDNN's WINOGRAD_NONFUSED supports): the transforms, 36
    batched GEMMs over the tiles, the transform back."""
    p, q = sh.out
    m_out = np.where(sh.r == 3, WINOGRAD_TILE, 2)
    tiles = sh.n * np.ceil(p / m_out) * np.ceil(q / m_out)
    points = WINOGRAD_POINTS
    if pass_ == "forward":
        dims = (tiles, sh.k, sh.c)
    elif pass_ == "backward_data":
        dims = (tiles, sh.c, sh.k)
    else:
        dims = (sh.k, sh.c, tiles)
    # the transformed tiles: written by a transform and read back by the next step
    # (the GEMM's own memory term counts its operands once more)
    transformed = elt * points * tiles * (sh.c + sh.k)
    transforms = (x_bytes + y_bytes + 2 * transformed) / gpu.achieved_bandwidth_bytes_per_s
    own = gpu.classes[math_class(key)].for_algorithm("winograd")
    gemm = gemm_seconds(gpu, key, *dims, batch=points, in_bytes=elt, out_bytes=elt, params=own)[0]
    return gemm + transforms + 2 * own.fixed_s


def _fft(gpu, key, sh: ConvShapes, pass_: str, elt: float):
    """FFT convolution: transforms of the image and filters padded to the FFT size, a
    complex GEMM per frequency, the inverse transform (each transform a memory pass of a
    complex tensor: 2x the real bytes, written and read)."""
    hf = 2.0 ** np.ceil(np.log2(sh.h + 2 * sh.pad_h))
    wf = 2.0 ** np.ceil(np.log2(sh.w + 2 * sh.pad_w))
    freqs = hf * (wf // 2 + 1)
    complex_bytes = 2 * elt * freqs
    transforms = complex_bytes * (sh.n * sh.c + sh.k * sh.c + sh.n * sh.k) * 2
    if pass_ == "forward":
        dims = (sh.n, sh.k, sh.c)
    elif pass_ == "backward_data":
        dims = (sh.n, sh.c, sh.k)
    else:
        dims = (sh.k, sh.c, sh.n)
    own = gpu.classes[math_class(key)].for_algorithm("fft")
    # a complex multiply-add is 4 real ones: 4x the GEMMs of each frequency
    gemm = gemm_seconds(gpu, key, *dims, batch=4 * freqs, in_bytes=elt, out_bytes=elt, params=own)[0]
    return gemm + transforms / gpu.achieved_bandwidth_bytes_per_s + 3 * own.fixed_s


def conv_seconds(gpu: GpuKernelModel, key: str, shape, pass_: str, elt: float):
    """(seconds, algorithm) of the fastest algorithm for one pass: floats for a
    ``ConvShape``, arrays for a ``ConvShapes``."""
    algos = conv_algorithms(gpu, key, shape, pass_, elt)
    names = list(algos)
    table = np.stack([algos[a] for a in names])
    pick = np.argmin(table, axis=0)
    seconds = table[pick, np.arange(table.shape[1])]
    chosen = np.array(names, dtype=object)[pick]
    if isinstance(shape, ConvShape):
        return float(seconds[0]), str(chosen[0])
    return seconds, chosen


def memory_seconds(gpu: GpuKernelModel, nbytes: float, launches: int, launch_overhead_s: float) -> float:
    """A memory-bound op: its bytes at the achieved bandwidth, plus its launches."""
    return launches * launch_overhead_s + nbytes / gpu.achieved_bandwidth_bytes_per_s


def _scalar(result) -> float:
    return float(np.asarray(result[0]).reshape(-1)[0])


# ---------------------------------------------------------------- documents

def from_document(raw: Mapping[str, Any], peaks: Mapping[str, float]) -> GpuKernelModel:
    """The kernel model of a profile's ``kernel_model`` object (profiles/README.md)."""
    classes = {}
    for name, c in raw["classes"].items():
        classes[name] = ClassParams(efficiency=float(c["efficiency"]), k_overhead=float(c["k_overhead"]),
                                    knee=float(c["knee"]), fixed_s=float(c["fixed_s"]),
                                    conv={k: float(v) for k, v in c.get("conv", {}).items()})
    return GpuKernelModel(sm_count=int(raw["sm_count"]),
                          achieved_bandwidth_bytes_per_s=float(raw["achieved_bandwidth_bytes_per_s"]),
                          peaks=dict(peaks), classes=classes, source=str(raw.get("source", "")))


def to_document(model: GpuKernelModel) -> dict[str, Any]:
    return {"sm_count": model.sm_count, "achieved_bandwidth_bytes_per_s": model.achieved_bandwidth_bytes_per_s,
            "source": model.source,
            "classes": {name: {"efficiency": c.efficiency, "k_overhead": c.k_overhead, "knee": c.knee,
                               "fixed_s": c.fixed_s, "conv": dict(c.conv)} for name, c in model.classes.items()}}
