"""Bundled example nets, generated in code (no net from elsewhere is copied in).

- ``dlrm_criteo_1tb``: the MLPerf Criteo Terabyte DLRM (planning only: ~96 GB of tables);
- ``dlrm_small``: the same structure with small tables (runs on a laptop);
- ``dlrm_40gb``: ten 8M-row tables (about 41 GB): more than one 16 GB GPU holds (planning only);
- ``resnet_small``: a small ResNet-style CNN;
- ``two_tower``: two independent heavy convolution towers joined at the end;
- ``faster_rcnn_r50_c4``: a Detectron-style R-50-C4 Faster R-CNN at 1x3x800x800
  (``faster_rcnn.py``: GenerateProposals, RoIAlign, BBoxTransform, BoxWithNMSLimit;
  33.8M parameters);
- ``resnet_tiny_int8``: a small ResNet-style net (SpatialBN folded) in Caffe2's Int8
  (QNNPACK) form, made by ``quantize.py`` (NCHW2NHWC, Int8Quantize, Int8ConvRelu, Int8Conv,
  Int8SumRelu, Int8MaxPool, Int8AveragePool, Int8FC, Int8Dequantize, a float Softmax);
- ``gpt2_tiny``: a GPT-2-style transformer (``gpt2.py``: Gather embeddings, LayerNorm,
  attention by BatchMatMul with a causal mask, Gelu MLP, tied head, SoftmaxWithLoss) at 2
  layers of width 32; ``gpt2.PRESETS`` has GPT-2 small to XL and a 10B configuration,
  built in code for planning (``python -m placer.examples gpt2-small FOLDER`` writes one);
- train nets (``train_nets.py``, made by placer's own train-net generator, each with the
  loss its model trains with): ``dlrm_small_train`` (Adagrad, SparseAdagrad on the
  tables), ``dlrm_criteo_1tb_train`` (RowWiseSparseAdagrad on the tables; planning only),
  ``resnet_small_train`` (SpatialBN in training mode, Nesterov momentum) and
  ``word2vec_train`` (``word2vec.py``: a 10M x 300 embedding table read by
  SparseLengthsSum, a projection, a softmax loss; Adagrad; planning only, 22 GiB with the
  optimizer state).

``python -m placer.examples [FOLDER]`` regenerates the files shipped in ``examples/data``.
"""
from __future__ import annotations

from pathlib import Path

from placer.examples import dlrm, faster_rcnn, gpt2, quantize, resnet, train_nets, two_tower

DATA = Path(__file__).resolve().parent / "data"


def builders() -> dict:
    return {
        "dlrm_criteo_1tb": lambda: dlrm.build(dlrm.criteo_1tb()),
        "dlrm_40gb": lambda: dlrm.build(dlrm.tables_40gb()),
        "two_tower": lambda: two_tower.build(),
        "dlrm_small": lambda: dlrm.build(dlrm.small()),
        "resnet_small": lambda: resnet.build(),
        "faster_rcnn_r50_c4": lambda: faster_rcnn.build(faster_rcnn.r50_c4_800()),
        "gpt2_tiny": lambda: gpt2.build(gpt2.preset("gpt2-tiny")),
        "resnet_tiny_int8": lambda: quantize.resnet_tiny_int8(),
    }


def generate(folder: str | Path = DATA) -> dict[str, dict[str, Path]]:
    """Write every bundled net (predict or train net, init, value_info) into ``folder``."""
    out = {name: make().save(folder, name) for name, make in builders().items()}
    out.update({name: train_nets.save(make(), folder, name) for name, make in train_nets.builders().items()})
    return out


def path(name: str) -> Path:
    """The shipped predict net of a bundled example."""
    p = DATA / f"{name}.pbtxt"
    if not p.exists():
        generate()
    return p
