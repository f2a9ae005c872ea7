"""The bundled examples as train nets, made by placer's own train-net generator.

A predict net has no loss, so each example gets the loss its model trains with, then
``placer.training.recipe.make_train_nets`` writes the gradient and optimizer ops as
``placer train-net`` does:

- DLRM (``dlrm.py``): the squared error of the click probability averaged over the batch
  (``SquaredL2Distance`` + ``AveragedLoss``, facebookresearch/dlrm's Caffe2 "mse" loss) on
  a ``click`` input; ``dlrm_small_train`` with Adagrad (SparseAdagrad on the tables),
  ``dlrm_criteo_1tb_train`` (the MLPerf terabyte configuration, planning only) with
  RowWiseSparseAdagrad on the tables and Adagrad on the MLPs, as MLPerf's DLRM trains.
- ResNet (``resnet.py``): SpatialBN in training mode (running mean and variance updated
  in place, saved statistics for the backward pass) and ``SoftmaxWithLoss`` on a
  ``label`` input instead of the Softmax; ``resnet_small_train`` with Nesterov momentum.
- word2vec (``word2vec.py``): ``word2vec_train``, Adagrad.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.examples.builder import NetBuilder, make_op
from placer.examples.dlrm import build as build_dlrm
from placer.examples.dlrm import criteo_1tb, small
from placer.examples.resnet import ResNetConfig
from placer.examples.resnet import build as build_resnet
from placer.examples.word2vec import train_nets as word2vec_train_nets
from placer.formats.caffe2 import net_from_netdef
from placer.training.recipe import OptimizerChoice, make_train_nets


@dataclass
class TrainNets:
    train: object            # NetDef
    init: object             # NetDef
    value_info: dict         # blob -> (dtype, shape) of the inputs a step is fed


def with_click_loss(b: NetBuilder, batch: int) -> NetBuilder:
    """A DLRM builder with the squared-error loss of its click probability."""
    b.input("click", (batch, 1))
    b.op("SquaredL2Distance", ["prob_click", "click"], "click_sq_dist")
    b.op("AveragedLoss", ["click_sq_dist"], "loss")
    del b.predict.external_output[:]
    b.output("loss")
    return b


def in_training_mode(b: NetBuilder, batch: int) -> NetBuilder:
    """A ResNet builder with SpatialBN in training mode and SoftmaxWithLoss on ``label``."""
    for op in b.predict.op:
        if op.type == "SpatialBN":
            x, _, _, mean, var = op.input
            y = op.output[0]
            del op.output[:]
            op.output.extend([y, mean, var, f"{y}_saved_mean", f"{y}_saved_inv_var"])
            for arg in op.arg:
                if arg.name == "is_test":
                    arg.i = 0
    last = b.predict.op[-1]
    assert last.type == "Softmax", last.type
    b.predict.op[-1].CopyFrom(make_op("SoftmaxWithLoss", [last.input[0], "label"], ["softmax", "loss"]))
    b.input("label", (batch,), "int32")
    del b.predict.external_output[:]
    b.output("loss")
    return b


def make(b: NetBuilder, optimizer: str, lr: float = 0.01) -> TrainNets:
    """The train net and init net of a builder whose net ends in ``loss``."""
    net = net_from_netdef(b.predict, b.init, path=b.predict.name)
    made = make_train_nets(net, ["loss"], OptimizerChoice(optimizer, lr))
    return TrainNets(made.train, made.init, dict(b.value_info))


def dlrm_train(cfg, optimizer: str) -> TrainNets:
    return make(with_click_loss(build_dlrm(cfg), cfg.batch), optimizer)


def resnet_train(cfg=None, optimizer: str = "nesterov") -> TrainNets:
    cfg = cfg or ResNetConfig()
    return make(in_training_mode(build_resnet(cfg), cfg.batch), optimizer)


def builders() -> dict:
    """name -> a function making its TrainNets."""
    def w2v() -> TrainNets:
        return TrainNets(*word2vec_train_nets())
    return {
        "dlrm_small_train": lambda: dlrm_train(small(), "adagrad"),
        "dlrm_criteo_1tb_train": lambda: dlrm_train(criteo_1tb(), "rowwise-adagrad"),
        "resnet_small_train": lambda: resnet_train(),
        "word2vec_train": w2v,
    }


def save(nets: TrainNets, folder, stem: str) -> dict:
    """``<stem>.pbtxt`` (the train net), ``<stem>_init.pbtxt``, ``<stem>.value_info.json``,
    written by ``NetBuilder.save`` as it writes a predict net."""
    out = NetBuilder(stem)
    out.predict, out.init, out.value_info = nets.train, nets.init, nets.value_info
    return out.save(folder, stem)


__all__ = ["TrainNets", "with_click_loss", "in_training_mode", "make", "dlrm_train", "resnet_train",
           "builders", "save"]
