"""A small ResNet-style CNN built in code (the bundled CNN example).

The same op mix as the Caffe2 model-zoo ResNet-50 predict net (Conv without bias ->
SpatialBN(is_test) -> Relu, residual ``Sum``, MaxPool stem, global AveragePool, FC,
Softmax) at a size that profiles and runs in seconds: a stem and three stages of basic
blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.examples.builder import NetBuilder


@dataclass(frozen=True)
class ResNetConfig:
    name: str = "resnet_small"
    batch: int = 8
    image: int = 64
    widths: tuple[int, ...] = (32, 64, 128)
    blocks_per_stage: int = 2
    classes: int = 100


def build(cfg: ResNetConfig = ResNetConfig()) -> NetBuilder:
    b = NetBuilder(cfg.name)
    x = b.input("data", (cfg.batch, 3, cfg.image, cfg.image))
    x = _conv_bn(b, "conv1", x, 3, cfg.widths[0], kernel=7, stride=2, pad=3, relu=True)
    x = b.op("MaxPool", [x], "pool1", kernel=3, stride=2, pad=1)
    cin = cfg.widths[0]
    for s, width in enumerate(cfg.widths):
        for k in range(cfg.blocks_per_stage):
            stride = 2 if (s > 0 and k == 0) else 1
            x = _basic_block(b, f"res{s + 2}_{k}", x, cin, width, stride)
            cin = width
    x = b.op("AveragePool", [x], "pool5", global_pooling=1)
    w = b.param("pred_w", (cfg.classes, cin), "XavierFill")
    bias = b.param("pred_b", (cfg.classes,), "ConstantFill", value=0.0)
    x = b.op("FC", [x, w, bias], "pred")
    b.output(b.op("Softmax", [x], "softmax"))
    return b


def _conv_bn(b: NetBuilder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int,
             pad: int, relu: bool) -> str:
    w = b.param(f"{name}_w", (cout, cin, kernel, kernel), "MSRAFill")
    y = b.op("Conv", [x, w], name, kernel=kernel, stride=stride, pad=pad)
    scale = b.param(f"{name}_bn_s", (cout,), "ConstantFill", value=1.0)
    shift = b.param(f"{name}_bn_b", (cout,), "ConstantFill", value=0.0)
    mean = b.param(f"{name}_bn_rm", (cout,), "ConstantFill", value=0.0)
    var = b.param(f"{name}_bn_riv", (cout,), "ConstantFill", value=1.0)
    y = b.op("SpatialBN", [y, scale, shift, mean, var], f"{name}_bn", is_test=1, epsilon=1e-5)
    return b.op("Relu", [y], y) if relu else y


def _basic_block(b: NetBuilder, name: str, x: str, cin: int, cout: int, stride: int) -> str:
    y = _conv_bn(b, f"{name}_a", x, cin, cout, 3, stride, 1, relu=True)
    y = _conv_bn(b, f"{name}_b", y, cout, cout, 3, 1, 1, relu=False)
    shortcut = x if (stride == 1 and cin == cout) else _conv_bn(b, f"{name}_proj", x, cin, cout, 1, stride, 0,
                                                                   relu=False)
    s = b.op("Sum", [y, shortcut], f"{name}_sum")
    return b.op("Relu", [s], s)
