"""A built-in sweep net that gives the fits points in every family common nets use.

The fits can only price what they have seen: a profile made on AlexNet and ResNet-50
has no depthwise or grouped convolution, so MobileNet's depthwise convs would be priced
as dense ones (60-70% under on the 2-core host), and a DLRM profiled at one batch size
has its embedding lookups at one size only. ``placer profile --calibrate`` runs this net
in-network (``in_network.profile_in_network``) at a few batch sizes so that each family
has points over a range of sizes:

- convolutions: a MobileNet-like chain (depthwise 3x3 at stride 1 and 2, 1x1
  projections, residual Sum), dense 3x3 / 5x5 / 7x7, grouped 3x3 (4 and 8 groups),
  each followed by SpatialBN and Relu, at 80x80 .. 5x5 images from a 160x160 input;
- pooling (Max 3x3/2, global Average), Concat of two and of four branches (as
  Inception joins them), Softmax;
- matrix products: FC at several row counts and widths; a DLRM-like interaction
  (Concat of many vectors, BatchMatMul, Flatten, BatchGather) at two sizes;
- embeddings: SparseLengthsSum over tables of 1k to 100k rows, Gather;
- elementwise: Relu, Sigmoid, Sum, Mul over sizes from a few KiB to a few MiB.

The widths (24, 48, 96, 192, 384) and image sizes are chosen off the usual ones (32, 64,
..., 224): the sweep teaches the fits, it does not give measured entries to the nets a
user plans, so a net's own ops are still priced from what was measured on that net.
"""
from __future__ import annotations

from placer.examples.builder import NetBuilder, make_op
from placer.formats.caffe2 import net_from_netdef
from placer.shapes import infer
from placer.types import TensorType, TypedNet

BATCHES = (1, 4)             # batch sizes the sweep runs at
IMAGE = 160                  # input image side
WIDTHS = (24, 48, 96, 192, 384)
FC_ROWS = (1, 6, 24, 96)     # rows of the standalone FCs (beside the batch-sized head)
FC_SHAPES = ((300, 600), (1000, 200), (2000, 1500))   # (outputs, inputs)
EMBEDDING_ROWS = (1000, 20000, 100000)
EMBEDDING_DIM = 48
LOOKUPS_PER_SAMPLE = (3, 20)
BAGS_PER_BATCH = (8, 128)      # bags (samples) per unit of the sweep's batch
INTERACTIONS = ((9, 48), (30, 96))   # (vectors, dimension) of the DLRM-like interactions
INCEPTION_WIDTHS = (24, 48, 12, 12)  # channels of the four branches a Concat joins


def build(batch: int = 1) -> NetBuilder:
    """The sweep net at ``batch`` (module docstring)."""
    b = NetBuilder(f"calibration_b{batch}")
    x = b.input("img", (batch, 3, IMAGE, IMAGE))
    x = _conv_bn_relu(b, "stem", x, 3, WIDTHS[0], kernel=3, stride=2, pad=1)        # 40x40
    dense = _dense_branch(b, x)
    x = _separable_chain(b, x)
    x = b.op("Concat", [x, dense], ["cat", "cat_info"], axis=1)
    head = b.op("AveragePool", [x], "gap", global_pooling=1)
    channels = WIDTHS[-1] + 2 * WIDTHS[1]
    w = b.param("head_w", (250, channels), "XavierFill")
    bias = b.param("head_b", (250,), "ConstantFill", value=0.0)
    b.output(b.op("Softmax", [b.op("FC", [head, w, bias], "head")], "prob"))
    _fc_sweep(b, batch)
    _embedding_sweep(b, batch)
    return b


def typed_nets() -> list[TypedNet]:
    """The sweep at every batch of ``BATCHES``, typed and ready to run."""
    return [typed(build(batch)) for batch in BATCHES]


def typed(builder: NetBuilder) -> TypedNet:
    net = net_from_netdef(builder.predict, builder.init, path=f"<{builder.predict.name}>")
    return infer(net, {name: TensorType(tuple(shape), dtype) for name, (dtype, shape) in builder.value_info.items()})


def _conv_bn_relu(b: NetBuilder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int,
                  pad: int, group: int = 1, relu: bool = True) -> str:
    w = b.param(f"{name}_w", (cout, cin // group, kernel, kernel), "MSRAFill")
    args = {"kernel": kernel, "stride": stride, "pad": pad, **({"group": group} if group > 1 else {})}
    y = b.op("Conv", [x, w], name, **args)
    stats = [b.param(f"{name}_bn_{p}", (cout,), "ConstantFill", value=v)
             for p, v in (("s", 1.0), ("b", 0.0), ("rm", 0.0), ("riv", 1.0))]
    y = b.op("SpatialBN", [y, *stats], f"{name}_bn", is_test=1, epsilon=1e-5)
    return b.op("Relu", [y], f"{name}_relu") if relu else y


def _separable_chain(b: NetBuilder, x: str) -> str:
    """Depthwise + 1x1 blocks down to 5x5, a residual at each width, grouped convs at 10x10."""
    cin = WIDTHS[0]
    for i, cout in enumerate(WIDTHS[1:]):
        d = _conv_bn_relu(b, f"dw{i}a", x, cin, cin, 3, 1, 1, group=cin)
        p = _conv_bn_relu(b, f"pw{i}a", d, cin, cin, 1, 1, 0, relu=False)
        x = b.op("Relu", [b.op("Sum", [x, p], f"res{i}")], f"res{i}_relu")
        d = _conv_bn_relu(b, f"dw{i}b", x, cin, cin, 3, 2, 1, group=cin)
        x = _conv_bn_relu(b, f"pw{i}b", d, cin, cout, 1, 1, 0)
        if cout == WIDTHS[3]:  # 10x10: grouped convs as ResNeXt / ShuffleNet use them
            x = _conv_bn_relu(b, "g4", x, cout, cout, 3, 1, 1, group=4)
            x = _conv_bn_relu(b, "g8", x, cout, cout, 3, 1, 1, group=8)
        cin = cout
    return x


def _dense_branch(b: NetBuilder, x: str) -> str:
    """Dense 3x3, 5x5 and 7x7 convs and pooling from 40x40 down to the chain's 3x3."""
    c = WIDTHS[1]
    y = _conv_bn_relu(b, "k3", x, WIDTHS[0], c, 3, 1, 1)
    y = b.op("MaxPool", [y], "mp1", kernel=3, stride=2, pad=1)
    branches = [_conv_bn_relu(b, f"inc{i}", y, c, w, 1, 1, 0) for i, w in enumerate(INCEPTION_WIDTHS)]
    y = b.op("Concat", branches, ["inc", "inc_info"], axis=1)
    y = _conv_bn_relu(b, "inc_proj", y, sum(INCEPTION_WIDTHS), c, 1, 1, 0)
    y = _conv_bn_relu(b, "k5", y, c, c, 5, 1, 2)
    y = b.op("MaxPool", [y], "mp2", kernel=3, stride=2, pad=1)                     # 10x10
    y = _conv_bn_relu(b, "k7", y, c, 2 * c, 7, 2, 3)                                  # 5x5
    y = b.op("Mul", [y, b.op("Sigmoid", [y], "gate")], "gated")
    return b.op("MaxPool", [y], "mp3", kernel=3, stride=2, pad=1)                  # 3x3


def _fc_sweep(b: NetBuilder, batch: int) -> None:
    """FCs at several row counts (scaled by the batch) and widths, and a DLRM-like
    interaction (Concat of many vectors, BatchMatMul, Flatten, BatchGather) at two sizes."""
    for rows in FC_ROWS:
        m = rows * batch
        for n, k in FC_SHAPES:
            x = b.input(f"fc_in_{m}_{k}", (m, k))
            w = b.param(f"fc_w_{m}_{n}_{k}", (n, k), "XavierFill")
            bias = b.param(f"fc_b_{m}_{n}_{k}", (n,), "ConstantFill", value=0.0)
            b.output(b.op("Relu", [b.op("FC", [x, w, bias], f"fc_{m}_{n}_{k}")], f"fc_{m}_{n}_{k}_relu"))
    for vectors, dim in INTERACTIONS:
        rows, tag = 8 * batch, f"{vectors}x{dim}"
        parts = [b.input(f"vec_{tag}_{i}", (rows, dim)) for i in range(vectors)]
        t = b.op("Concat", parts, [f"stack_{tag}", f"stack_{tag}_info"], axis=1, add_axis=1)
        z = b.op("Flatten", [b.op("BatchMatMul", [t, t], f"dots_{tag}", trans_b=1)], f"flat_{tag}", axis=1)
        tril = [j + i * vectors for i in range(vectors) for j in range(i)]
        b.init.op.append(make_op("GivenTensorIntFill", [], [f"tril_{tag}"], shape=[len(tril)], values=tril))
        b.init.external_output.append(f"tril_{tag}")
        b.predict.external_input.append(f"tril_{tag}")
        b.output(b.op("BatchGather", [z, f"tril_{tag}"], f"pairs_{tag}"))


def _embedding_sweep(b: NetBuilder, batch: int) -> None:
    """SparseLengthsSum over small to large tables at two bag sizes and two bag counts
    (so that the fit sees the fixed cost of a call apart from the bytes it moves: a
    DLRM's lookups at batch 64 were over-predicted by half from batch-8 points alone),
    and a Gather."""
    for rows in EMBEDDING_ROWS:
        table = b.param(f"emb_{rows}", (rows, EMBEDDING_DIM), "UniformFill", min=-0.01, max=0.01)
        for per_sample in LOOKUPS_PER_SAMPLE:
            for bags in BAGS_PER_BATCH:
                n, tag = bags * batch, f"{rows}_{per_sample}" + ("" if bags == BAGS_PER_BATCH[0] else f"_x{bags}")
                idx = b.input(f"emb_{tag}_i", (n * per_sample,), "int64")
                lens = b.input(f"emb_{tag}_l", (n,), "int32")
                b.output(b.op("SparseLengthsSum", [table, idx, lens], f"sls_{tag}"))
        gidx = b.input(f"gather_{rows}_i", (16 * batch,), "int64")
        b.output(b.op("Gather", [table, gidx], f"gather_{rows}"))
