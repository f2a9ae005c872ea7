"""A word2vec-style model: one large embedding table trained with sparse Adagrad.

CBOW (Mikolov et al. 2013): each sample is a window of context word ids; their rows of the
embedding table are summed (``SparseLengthsSum``), projected by an FC onto the output
classes and scored by ``SoftmaxWithLoss`` against the centre word. The output side is a
softmax over ``classes`` words (the frequent words a sampled or hierarchical softmax
would cover), so that the table -- ``rows`` x ``dim`` float32, 1-10 million rows of 300 --
is what makes the model large.

The train net is made by placer's own generator (``placer.training.recipe``, what
``placer train-net --optimizer adagrad`` writes): the table's gradient is a GradientSlice
(the looked-up ids and one row per lookup) and its update a ``SparseAdagrad`` whose
squared-sum state is as large as the table itself; the projection is updated by
``Adagrad``.

``build(cfg)`` gives the forward net with its loss; ``train_nets(cfg)`` the train net and
its init net; ``python -m placer.examples`` writes them into ``examples/data``
(``word2vec_train*``: the fills carry shapes only, so a 10M-row table costs no disk).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.training.recipe import OptimizerChoice, make_train_nets


@dataclass(frozen=True)
class Word2VecConfig:
    name: str = "word2vec"
    rows: int = 10_000_000     # vocabulary: rows of the embedding table
    dim: int = 300
    classes: int = 10_000      # output words of the softmax
    batch: int = 1024          # samples (centre words) per step
    window: int = 8            # context words per sample
    lr: float = 0.05


def build(cfg: Word2VecConfig = Word2VecConfig()) -> NetBuilder:
    """The forward net: lookup, projection, softmax loss (blob ``loss``)."""
    b = NetBuilder(cfg.name)
    b.predict.type = "simple"
    bound = 0.5 / cfg.dim      # word2vec's initial range for input vectors
    table = b.param("emb_w", (cfg.rows, cfg.dim), "UniformFill", min=-bound, max=bound)
    ids = b.input("context_ids", (cfg.batch * cfg.window,), "int64")
    lengths = b.input("context_lengths", (cfg.batch,), "int32")
    label = b.input("centre_word", (cfg.batch,), "int32")
    hidden = b.op("SparseLengthsSum", [table, ids, lengths], "context_sum")
    w = b.param("proj_w", (cfg.classes, cfg.dim), "XavierFill")
    bias = b.param("proj_b", (cfg.classes,), "ConstantFill", value=0.0)
    logits = b.op("FC", [hidden, w, bias], "logits")
    b.op("SoftmaxWithLoss", [logits, label], ["softmax", "loss"])
    b.output("loss")
    return b


def train_nets(cfg: Word2VecConfig = Word2VecConfig()):
    """(train NetDef, init NetDef, value_info dict) made by placer's train-net generator
    with Adagrad (SparseAdagrad on the table)."""
    b = build(cfg)
    net = net_from_netdef(b.predict, b.init, path=cfg.name)
    made = make_train_nets(net, ["loss"], OptimizerChoice("adagrad", cfg.lr))
    return made.train, made.init, b.value_info


def table_bytes(cfg: Word2VecConfig) -> int:
    """Bytes of the embedding table (float32); Adagrad's squared sums take as many again."""
    return 4 * cfg.rows * cfg.dim


def describe(cfg: Word2VecConfig) -> str:
    gib = table_bytes(cfg) / 2 ** 30
    return (f"{cfg.name}: {cfg.rows:,} x {cfg.dim} table ({gib:.1f} GiB, {2 * gib:.1f} GiB with Adagrad's "
            f"squared sums), {cfg.classes:,}-way softmax, batch {cfg.batch} x {cfg.window} context words; "
            f"{math.ceil(cfg.batch * cfg.window * cfg.dim * 4 / 2 ** 20)} MiB of gradient rows per step")

