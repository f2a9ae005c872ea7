"""Op family 'conv': Conv and ConvTranspose with Caffe2's semantics.

Layouts (Caffe2): Conv X is (N, C, H, W) for order NCHW or (N, H, W, C) for NHWC; the filter
is (M, C/group, kH, kW) for NCHW and (M, kH, kW, C/group) for NHWC; the optional bias is (M,).
ConvTranspose's filter is (C, M/group, kH, kW) for NCHW and (C, kH, kW, M/group) for NHWC
(C input channels, M output channels), its output size is (H - 1) * stride + kH + adj -
pad_t - pad_b, it has no dilation, and legacy_pad VALID/SAME both mean "no pads".

Cost convention: one multiply-add is 1 MAC and 2 FLOPs; Conv MACs = N * M * Ho * Wo *
(C/group) * kH * kW, and the bias adds N * M * Ho * Wo flops. Bytes read are X, the filter
and the bias; bytes written are the output.

How the kernel stays fast (the planner's CPU costs come from it): the padded input is split
once into stride phases (only for stride > 1); every filter tap (i, j) then reads one
*contiguous* slice of a phase flattened over (rows x padded width) -- output columns past
Wo are computed on the padded width and dropped at the end -- so no im2col window copy is
needed when the per-group channel count is large: one GEMM per tap accumulates into the
output (``_ACCUMULATE_MIN_CHANNELS``), in cache-sized blocks of images and positions. A 1x1
convolution with stride 1 and no pad is a single matmul on the input as it is. With few
channels per group (AlexNet conv1, C=3) the tap slices are stacked into one K = C*kH*kW
GEMM instead, block by block as well. Depthwise convolutions (C/group == 1) are a broadcast multiply-add per tap,
also blocked for the cache. Groups are a batch dimension of the matmul; the only Python
loops are over filter taps and cache blocks, never over channels or pixels. On a GPU
(``xp`` not numpy) the blocks are one block.

On a GPU with cuDNN (cupy 13 with libcudnn) Conv and ConvTranspose run through cuDNN
instead, and this decomposition is the fallback for what cuDNN cannot take (asymmetric
pads, other dtypes): ``cudnn_conv`` decides per call and notes which engine ran.
"""
from __future__ import annotations

from placer.errors import ArgumentError, ShapeError
from placer.ops import cudnn_conv
from placer.ops.registry import OpDef, register
from placer.ops.spatial_args import Window, parse_window, shape_of
from placer.types import Args, OpFeatures, TensorType, shape_str

# Channels per group from which one GEMM per filter tap beats one stacked GEMM (measured
# with bench/conv_kernels.py on a 2-core OpenBLAS machine).
_ACCUMULATE_MIN_CHANNELS = 32
# Output elements per block of the accumulated tap GEMMs (512 KiB of float32), and the
# fewest positions a block's GEMM gets (narrower GEMMs lose more to call overhead).
_GEMM_BLOCK_ELEMENTS = 1 << 17
_GEMM_MIN_COLUMNS = 256
# Elements of stacked columns per block of the deep GEMM (8 MiB of float32).
_STACK_BLOCK_ELEMENTS = 1 << 21
# Output elements per block of the depthwise multiply-add (about 1 MiB of float32: the
# block, the scratch and the input rows then stay in a core's L2 cache).
_DEPTHWISE_BLOCK_ELEMENTS = 1 << 16


def _filter_kernel(w: TensorType, nchw: bool) -> tuple[int, int]:
    return (w.shape[2], w.shape[3]) if nchw else (w.shape[1], w.shape[2])


def _conv_window(inputs, args: Args) -> Window:
    w = inputs[1]
    order_nchw = args.str("order", "NCHW").upper() != "NHWC"
    kernel = _filter_kernel(w, order_nchw) if w.ndim == 4 else None
    return parse_window(args, kernel_from=kernel)


# ---------------------------------------------------------------- shapes and costs

def _conv_geometry(inputs, args: Args):
    """Checks a Conv's inputs; returns (window, N, C, M, (Ho, Wo), pads)."""
    x, w = inputs[0], inputs[1]
    win = _conv_window(inputs, args)
    n, c, h, wd = win.image_dims(x, args.op)
    if w.ndim != 4:
        raise ShapeError(f"op {args.op}: Conv filter must be 4-D, found {shape_str([w])}")
    group = args.int("group", 1)
    m, cg = w.shape[0], (w.shape[1] if win.nchw else w.shape[3])
    if group < 1 or c % group or m % group:
        raise ShapeError(f"op {args.op}: group={group} must divide input channels C={c} of X "
                         f"{shape_str([x])} and filter count M={m} of W {shape_str([w])}")
    if cg * group != c:
        raise ShapeError(f"op {args.op}: filter W {shape_str([w])} has {cg} channels per group "
                         f"but X {shape_str([x])} ({win.order}) has C={c} with group={group} "
                         f"(C/group={c // group})")
    if _filter_kernel(w, win.nchw) != tuple(win.kernel):
        raise ShapeError(f"op {args.op}: filter W {shape_str([w])} has kernel "
                         f"{_filter_kernel(w, win.nchw)} but the arguments say {tuple(win.kernel)}")
    if len(inputs) > 2 and tuple(inputs[2].shape) != (m,):
        raise ShapeError(f"op {args.op}: bias {shape_str([inputs[2]])} should have shape ({m},) "
                         f"to match filter W {shape_str([w])}")
    out, pads = win.resolve(h, wd, args.op)
    return win, n, c, m, out, pads


def _image_type(win: Window, n: int, c: int, hw: tuple[int, int], dtype: str) -> TensorType:
    return TensorType((n, c, *hw) if win.nchw else (n, *hw, c), dtype)


def conv_infer(inputs, args: Args):
    win, n, _, m, out, _ = _conv_geometry(inputs, args)
    return [_image_type(win, n, m, out, inputs[0].dtype)]


def conv_cost(inputs, outputs, args: Args) -> OpFeatures:
    """MACs = N*M*Ho*Wo*(C/group)*kH*kW; flops = 2*MACs + one add per output for the bias."""
    win, n, c, m, (ho, wo), _ = _conv_geometry(inputs, args)
    group = args.int("group", 1)
    macs = float(n * m * ho * wo * (c // group) * win.kernel[0] * win.kernel[1])
    bias = float(n * m * ho * wo) if len(inputs) > 2 else 0.0
    return OpFeatures(flops=2 * macs + bias, macs=macs,
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


# ---------------------------------------------------------------- the conv kernel

def _taps(win: Window):
    """Each filter tap (i, j) as (phase row, phase col, row offset, col offset) in a phase."""
    (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.stride, win.dilation
    return [(i * dh % sh, j * dw % sw, i * dh // sh, j * dw // sw)
            for i in range(kh) for j in range(kw)]


def _phases(xp, x, win: Window, hw, pads, out, group):
    """The zero-padded input split into stride phases, each flattened over (rows, cols).

    Returns ({(a, b): array}, padded phase width). NCHW phases are (N, G, C/G, rows*cols);
    NHWC phases are (N, rows*cols, G, C/G). Rows are padded so that every tap's slice of
    length Ho * width stays inside its phase.
    """
    (h, w), (ho, wo), (sh, sw) = hw, out, win.stride
    taps = _taps(win)
    max_r, max_c = max(t[2] for t in taps), max(t[3] for t in taps)
    rows = max(-(-(h + pads[0] + pads[2]) // sh), ho + max_r + (1 if max_c else 0))
    cols = max(-(-(w + pads[1] + pads[3]) // sw), wo + max_c)
    bottom, right = rows * sh - h - pads[0], cols * sw - w - pads[1]
    spatial = ((pads[0], bottom), (pads[1], right))
    if any(p for pair in spatial for p in pair):
        widths = ((0, 0), (0, 0), *spatial) if win.nchw else ((0, 0), *spatial, (0, 0))
        x = xp.pad(x, widths)
    n = x.shape[0]
    c = x.shape[1] if win.nchw else x.shape[3]
    phases = {}
    for a, b in {(t[0], t[1]) for t in taps}:
        if win.nchw:
            p = x if sh == sw == 1 else x[:, :, a::sh, b::sw]
            phases[(a, b)] = xp.ascontiguousarray(p).reshape(n, group, c // group, rows * cols)
        else:
            p = x if sh == sw == 1 else x[:, a::sh, b::sw, :]
            phases[(a, b)] = xp.ascontiguousarray(p).reshape(n, rows * cols, group, c // group)
    return phases, cols


def conv2d(xp, x, w, bias, win: Window, pads, out, group: int):
    """Caffe2 Conv on arrays (the shared core of the Conv kernel)."""
    nchw = win.nchw
    n, h, wd = x.shape[0], *(x.shape[2:] if nchw else x.shape[1:3])
    m = w.shape[0]
    cg, mg, (ho, wo) = (w.shape[1] if nchw else w.shape[3]), m // group, out
    phases, cols = _phases(xp, x, win, (h, wd), pads, out, group)
    length = ho * cols
    taps = _taps(win)
    kk = len(taps)

    def tap(t):
        a, b, r, c = t
        off = r * cols + c
        p = phases[(a, b)]
        return p[..., off:off + length] if nchw else p[:, off:off + length]

    # Filter as (taps, G, Mg, Cg) for NCHW and (taps, G, Cg, Mg) for NHWC.
    if nchw:
        wt = xp.ascontiguousarray(w.reshape(group, mg, cg, kk).transpose(3, 0, 1, 2))
    else:
        wt = xp.ascontiguousarray(w.reshape(group, mg, kk, cg).transpose(2, 0, 3, 1))
    if cg == 1:                     # depthwise-like: broadcast multiply-add per tap
        y = _depthwise(xp, [tap(t) for t in taps], wt if nchw else wt.reshape(kk, group, mg), nchw)
    elif kk == 1:                   # 1x1: one GEMM straight on the (strided) input
        y = _tap_gemm(xp, tap(taps[0]), wt[0], nchw)
    elif cg >= _ACCUMULATE_MIN_CHANNELS:   # one GEMM per tap, accumulated block by block
        y = _in_blocks(xp, [tap(t) for t in taps], lambda part: _accumulate(xp, part, wt, nchw),
                       nchw, (n, group, mg, length), group * mg, _GEMM_BLOCK_ELEMENTS)
    else:                           # few channels: stack the taps into one deep GEMM per block
        y = _in_blocks(xp, [tap(t) for t in taps], lambda part: _stacked(xp, part, w, nchw, group),
                       nchw, (n, group, mg, length), group * cg * kk, _STACK_BLOCK_ELEMENTS)
    return _finish(xp, y, bias, nchw, cg == 1, (n, m, ho, wo, cols, group))


def _depthwise(xp, taps, w_taps, nchw: bool):
    """Sum over taps of tap * weight, in blocks small enough for the running sum to stay in cache.

    NCHW: (N, G, 1, L) * (G, Mg, 1) -> (N, G, Mg, L), blocked over images and groups;
    NHWC: (N, L, G, 1) * (G, Mg) -> (N, L, G, Mg), blocked over images and positions.
    Without blocking every tap streams the whole output through memory twice.
    """
    n, width = taps[0].shape[0], taps[0].shape[1]
    first = taps[0][:1, :1] * w_taps[0][:1]
    y = xp.empty((n, width, *first.shape[2:]), dtype=first.dtype)
    # Blocking pays on a CPU's caches; on a GPU one block avoids thousands of tiny launches.
    budget = _DEPTHWISE_BLOCK_ELEMENTS if getattr(xp, "__name__", "") == "numpy" else y.size
    cols = min(width, max(1, budget // first.size))
    rows = max(1, budget // (first.size * width)) if cols == width else 1
    scratch = xp.empty((min(rows, n), cols, *first.shape[2:]), dtype=first.dtype)
    for i in range(0, n, rows):
        for j in range(0, width, cols):
            r, c = slice(i, i + rows), slice(j, j + cols)
            out = y[r, c]
            part = scratch[:out.shape[0], :out.shape[1]]
            xp.multiply(taps[0][r, c], w_taps[0][c] if nchw else w_taps[0], out=out)
            for t in range(1, len(taps)):
                out += xp.multiply(taps[t][r, c], w_taps[t][c] if nchw else w_taps[t], out=part)
    return y


def _in_blocks(xp, taps, compute, nchw: bool, dims, per_position: int, budget: int):
    """``compute(tap slices)`` over (images x positions) blocks of about ``budget`` elements.

    ``per_position`` is how many elements one output position costs in the block's working
    set (the running sum for accumulated GEMMs, the stacked columns for the deep GEMM).
    Keeping a block in cache is worth 30-50% on large images (224x224 3x3, AlexNet conv1
    at batch 8); small problems and GPUs run as one block.
    """
    n, group, mg, length = dims
    if getattr(xp, "__name__", "") != "numpy" or n * per_position * length <= budget:
        return compute(taps)
    cols = min(length, max(_GEMM_MIN_COLUMNS, budget // per_position))
    rows = max(1, budget // (per_position * length)) if cols == length else 1
    y = xp.empty((n, group, mg, length) if nchw else (n, group, length, mg), dtype=taps[0].dtype)
    for i in range(0, n, rows):
        for j in range(0, length, cols):
            r, c = slice(i, i + rows), slice(j, j + cols)
            block = compute([t[r, ..., c] if nchw else t[r, c] for t in taps])
            if nchw:
                y[r, ..., c] = block
            else:
                y[r, :, c] = block
    return y


def _accumulate(xp, taps, wt, nchw: bool):
    """Sum over taps of one GEMM each: (N, G, Mg, L) for NCHW, (N, G, L, Mg) for NHWC."""
    y = _tap_gemm(xp, taps[0], wt[0], nchw)
    for t in range(1, len(taps)):
        y += _tap_gemm(xp, taps[t], wt[t], nchw)
    return y


def _stacked(xp, taps, w, nchw: bool, group: int):
    """The taps stacked into one K = Cg*kH*kW operand (an im2col of contiguous slices)."""
    kk, m = len(taps), w.shape[0]
    stack = xp.stack(taps, axis=3)
    if nchw:                        # (N, G, Cg, kk, L): K ordered (Cg, kh, kw) like W
        n, _, cg, _, length = stack.shape
        return xp.matmul(w.reshape(group, m // group, cg * kk), stack.reshape(n, group, cg * kk, length))
    n, length, _, _, cg = stack.shape   # (N, L, G, kk, Cg): K ordered (kh, kw, Cg) like W
    k_mat = w.reshape(group, m // group, kk * cg).transpose(0, 2, 1)
    return xp.matmul(stack.reshape(n, length, group, kk * cg).transpose(0, 2, 1, 3), k_mat)


def _tap_gemm(xp, tap, w_tap, nchw: bool):
    """(G, Mg, Cg) @ (N, G, Cg, L) for NCHW; (N, G, L, Cg) @ (G, Cg, Mg) for NHWC."""
    if nchw:
        return xp.matmul(w_tap, tap)
    return xp.matmul(tap.transpose(0, 2, 1, 3), w_tap)


def _finish(xp, y, bias, nchw: bool, depthwise: bool, dims):
    """Drops the padded-width columns, restores the layout and adds the bias in one pass."""
    n, m, ho, wo, cols, group = dims
    if nchw:
        y = y.reshape(n, m, ho, cols)[..., :wo]
        b = None if bias is None else bias.reshape(m, 1, 1)
    else:
        if not depthwise:           # (N, G, L, Mg) -> (N, L, G, Mg)
            y = y.transpose(0, 2, 1, 3)
        y = y.reshape(n, ho, cols, group, m // group)[:, :, :wo]
        b = None if bias is None else bias.reshape(group, m // group)
    if b is not None:
        y = y + b
    else:
        y = xp.ascontiguousarray(y)
    return y.reshape(n, m, ho, wo) if nchw else y.reshape(n, ho, wo, m)


def _add_bias(xp, y, bias, nchw: bool):
    """``y + bias`` per output channel (axis 1 in NCHW, the last in NHWC), in y's dtype."""
    return y + (bias.reshape(1, -1, 1, 1) if nchw else bias)


def conv_kernel(xp, inputs, args: Args):
    win = _conv_window([shape_of(a) for a in inputs[:2]], args)
    x, w = inputs[0], inputs[1]
    n, c, h, wd = win.image_dims(shape_of(x), args.op)
    out, pads = win.resolve(h, wd, args.op)
    bias = inputs[2] if len(inputs) > 2 else None
    group = args.int("group", 1)
    y = cudnn_conv.forward(xp, args.op, x, w, bias, win, pads, out, group)
    if y is not None:
        return (y,)
    if all(a.dtype == xp.float16 for a in inputs):
        # float16 on the GEMM path as Caffe2's cuDNN Conv computes it: the convolution in
        # float (CUDNN_DATA_FLOAT compute) rounded to float16 once, then the bias added in
        # float16 (cudnnAddTensor), a second rounding
        y = conv2d(xp, x.astype(xp.float32), w.astype(xp.float32), None, win, pads, out, group)
        y = y.astype(xp.float16)
        if bias is not None:
            y = _add_bias(xp, y, bias, win.nchw)
        return (y,)
    return (conv2d(xp, x, w, bias, win, pads, out, group),)


# ---------------------------------------------------------------- ConvTranspose

def _transpose_geometry(inputs, args: Args):
    """Checks a ConvTranspose's inputs; returns (window, N, C, M, (Ho, Wo), pads)."""
    x, w = inputs[0], inputs[1]
    for name in ("dilation", "dilations", "dilation_h", "dilation_w"):
        if name in args:
            raise ArgumentError(f"op {args.op}: Caffe2's ConvTranspose has no dilation "
                                f"(argument '{name}')")
    win = _conv_window(inputs, args)
    if win.legacy_pad == 3:
        raise ArgumentError(f"op {args.op}: ConvTranspose does not support legacy_pad "
                            "CAFFE_LEGACY_POOLING")
    n, c, h, wd = win.image_dims(x, args.op)
    if w.ndim != 4:
        raise ShapeError(f"op {args.op}: ConvTranspose filter must be 4-D, found {shape_str([w])}")
    group = args.int("group", 1)
    if w.shape[0] != c or group < 1 or c % group:
        raise ShapeError(f"op {args.op}: ConvTranspose filter W {shape_str([w])} must have "
                         f"C={c} rows, the channels of X {shape_str([x])}, divisible by group={group}")
    if _filter_kernel(w, win.nchw) != tuple(win.kernel):
        raise ShapeError(f"op {args.op}: filter W {shape_str([w])} has kernel "
                         f"{_filter_kernel(w, win.nchw)} but the arguments say {tuple(win.kernel)}")
    m = (w.shape[1] if win.nchw else w.shape[3]) * group
    if len(inputs) > 2 and tuple(inputs[2].shape) != (m,):
        raise ShapeError(f"op {args.op}: bias {shape_str([inputs[2]])} should have shape ({m},)")
    adj = _adj(args)
    pads = (0, 0, 0, 0) if win.legacy_pad in (1, 2) else win.pads
    out = tuple((size - 1) * s + k + a - pads[d] - pads[d + 2]
                for d, (size, s, k, a) in enumerate(zip((h, wd), win.stride, win.kernel, adj)))
    if any(a > s for a, s in zip(adj, win.stride)) or min(out) < 1:
        raise ShapeError(f"op {args.op}: ConvTranspose of X {shape_str([x])} gives output size "
                         f"{out} with adj {adj} (adj must be <= stride {win.stride})")
    return win, n, c, m, out, pads


def _adj(args: Args) -> tuple[int, int]:
    if "adjs" in args:
        adjs = tuple(args.ints("adjs"))
        if len(adjs) != 2:
            raise ArgumentError(f"op {args.op}: ConvTranspose 'adjs' has {len(adjs)} value(s); a 2-D "
                                "ConvTranspose takes two (height, width)")
        return adjs
    if "adj" in args:
        return (args.int("adj"),) * 2
    return (args.int("adj_h", 0), args.int("adj_w", 0))


def conv_transpose_infer(inputs, args: Args):
    win, n, _, m, out, _ = _transpose_geometry(inputs, args)
    return [_image_type(win, n, m, out, inputs[0].dtype)]


def conv_transpose_cost(inputs, outputs, args: Args) -> OpFeatures:
    """MACs = N*C*H*W*(M/group)*kH*kW (every input pixel meets every tap); bias adds per output."""
    win, n, c, m, (ho, wo), _ = _transpose_geometry(inputs, args)
    h, w = win.image_dims(inputs[0], args.op)[2:]
    macs = float(n * c * h * w * (m // args.int("group", 1)) * win.kernel[0] * win.kernel[1])
    bias = float(n * m * ho * wo) if len(inputs) > 2 else 0.0
    return OpFeatures(flops=2 * macs + bias, macs=macs,
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


def conv_transpose_kernel(xp, inputs, args: Args):
    """cuDNN's data gradient where it applies (``cudnn_conv.transpose``); else one GEMM
    (filter^T @ X) for all taps, then one strided add per tap (col2im)."""
    x, w = inputs[0], inputs[1]
    win, n, c, m, (ho, wo), pads = _transpose_geometry([shape_of(a) for a in inputs], args)
    group = args.int("group", 1)
    y = cudnn_conv.transpose(xp, args.op, x, w, inputs[2] if len(inputs) > 2 else None, win, pads,
                             (ho, wo), _adj(args), group)
    if y is not None:
        return (y,)
    cg, mg = c // group, m // group
    (kh, kw), (sh, sw) = win.kernel, win.stride
    h, wd = (x.shape[2], x.shape[3]) if win.nchw else (x.shape[1], x.shape[2])
    full_h, full_w = max((h - 1) * sh + kh, pads[0] + ho), max((wd - 1) * sw + kw, pads[1] + wo)
    if win.nchw:     # W (C, Mg, kh, kw) -> (G, Mg*kh*kw, Cg) @ X (N, G, Cg, H*W)
        cols = xp.matmul(w.reshape(group, cg, mg * kh * kw).transpose(0, 2, 1),
                         x.reshape(n, group, cg, h * wd))
        cols = cols.reshape(n, m, kh, kw, h, wd)
        y = xp.zeros((n, m, full_h, full_w), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                y[:, :, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw] += cols[:, :, i, j]
        y = y[:, :, pads[0]:pads[0] + ho, pads[1]:pads[1] + wo]
        b = None if len(inputs) < 3 else inputs[2].reshape(m, 1, 1)
    else:            # W (C, kh, kw, Mg) -> (G, Cg, kh*kw*Mg); X (N, H*W, G, Cg)
        xg = x.reshape(n, h * wd, group, cg).transpose(0, 2, 1, 3)
        cols = xp.matmul(xg, w.reshape(group, cg, kh * kw * mg))      # (N, G, HW, kh*kw*Mg)
        cols = cols.reshape(n, group, h, wd, kh, kw, mg).transpose(0, 2, 3, 4, 5, 1, 6)
        cols = cols.reshape(n, h, wd, kh, kw, m)
        y = xp.zeros((n, full_h, full_w, m), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                y[:, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw] += cols[:, :, :, i, j]
        y = y[:, pads[0]:pads[0] + ho, pads[1]:pads[1] + wo]
        b = None if len(inputs) < 3 else inputs[2]
    return ((y + b) if b is not None else xp.ascontiguousarray(y),)


def conv_launches(inputs, args: Args) -> int:
    """Kernel launches of ``conv2d`` on a GPU (one block): the pad, one copy per stride
    phase, the filter reordering and the finishing pass (bias add or copy) around
    - depthwise: a multiply, then a multiply and an add per further tap;
    - 1x1: one GEMM (no pad, no filter copy);
    - many channels per group: a GEMM per tap and an add per further tap;
    - few channels per group: the stacked taps and one GEMM."""
    win = _conv_window(inputs[:2], args)
    kk = win.kernel[0] * win.kernel[1]
    phases = len({t[:2] for t in _taps(win)}) if max(win.stride) > 1 else 0
    w = inputs[1]
    cg = w.shape[1] if win.nchw else w.shape[3]
    if kk == 1 and cg != 1:
        return 2 + phases
    core = 2 * kk - 1 if cg == 1 or cg >= _ACCUMULATE_MIN_CHANNELS else 2
    return 3 + phases + core


def conv_transpose_launches(inputs, args: Args) -> int:
    """The GEMM, the zeroed output, an add per tap and the bias add (or a copy)."""
    kh, kw = _conv_window(inputs[:2], args).kernel
    return 3 + kh * kw


register(OpDef(type="Conv", infer=conv_infer, kernel=conv_kernel, cost=conv_cost,
               min_inputs=2, max_inputs=3, launches=conv_launches,
               doc="2-D convolution: X, filter[, bias] -> Y (Caffe2 ConvPoolOpBase arguments, group)"))
register(OpDef(type="ConvTranspose", infer=conv_transpose_infer, kernel=conv_transpose_kernel,
               cost=conv_transpose_cost, min_inputs=2, max_inputs=3,
               launches=conv_transpose_launches,
               doc="2-D transposed convolution: X, filter (C, M/group, kH, kW)[, bias] -> Y"))
