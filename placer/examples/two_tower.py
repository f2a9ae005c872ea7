"""A two-tower CNN: two independent heavy convolution branches over one image, joined at the end.

The case where a second GPU pays under the overlapped (makespan) objective and not under
the serial one: each tower is a chain of 3x3 convolutions (SpatialBN, Relu) with no op
reading the other tower until the final ``Concat`` + ``FC``. Ops one after another
(Caffe2 ``simple``) gain nothing from a second GPU and pay a copy; with one stream per GPU
(``dag`` / ``async_scheduling``) each tower runs on its own GPU at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.examples.builder import NetBuilder
from placer.examples.resnet import _conv_bn


@dataclass(frozen=True)
class TwoTowerConfig:
    name: str = "two_tower"
    batch: int = 32
    image: int = 56
    width: int = 128
    depth: int = 8            # 3x3 convolutions per tower
    classes: int = 100


def build(cfg: TwoTowerConfig = TwoTowerConfig()) -> NetBuilder:
    b = NetBuilder(cfg.name)
    b.predict.type = "dag"
    x = b.input("data", (cfg.batch, 3, cfg.image, cfg.image))
    heads = []
    for tower in ("left", "right"):
        y, cin = x, 3
        for k in range(cfg.depth):
            y = _conv_bn(b, f"{tower}_conv{k}", y, cin, cfg.width, kernel=3, stride=1, pad=1, relu=True)
            cin = cfg.width
        heads.append(b.op("AveragePool", [y], f"{tower}_pool", global_pooling=1))
    joined = b.op("Concat", heads, ["joined", "joined_info"], axis=1)
    w = b.param("pred_w", (cfg.classes, 2 * cfg.width), "XavierFill")
    bias = b.param("pred_b", (cfg.classes,), "ConstantFill", value=0.0)
    b.output(b.op("Softmax", [b.op("FC", [joined, w, bias], "pred")], "softmax"))
    return b
