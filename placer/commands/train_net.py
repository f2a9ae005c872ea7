"""``placer train-net``: a predict net -> the Caffe2 train net and init net, as Caffe2 writes them."""
from __future__ import annotations

import argparse
from collections import Counter

from placer import arguments
from placer.commands.common import add_net_arguments, parse_input_specs
from placer.fileio import OutputDir
from placer.formats import load_net
from placer.training.files import check_output_dir, save_train_nets
from placer.training.loss_scaling import DynamicScale
from placer.training.precision import PRECISIONS
from placer.training.recipe import OPTIMIZERS, UPDATE_ORDERS, OptimizerChoice, make_train_nets, parse_lr_args

DESCRIPTION = """\
Write the train net Caffe2 itself would write for NET: the forward ops, the gradient ops
of net.AddGradientOperators([LOSS]) and the optimizer ops of caffe2.python.optimizer's
build_sgd / build_adagrad / build_adam (torch 1.8.1's Caffe2, op for op), into
OUTDIR/train_net.pbtxt, and the init net (the parameters' fills, the iteration counter
and its mutex, the optimizer state) into OUTDIR/train_init_net.pbtxt.

The parameters are the blobs the init net fills that get a gradient. Optimizers:
  sgd                WeightedSum with -lr
  momentum/nesterov  MomentumSGDUpdate (nesterov 0 / 1), --momentum (default 0.9)
  adagrad            Adagrad / SparseAdagrad (--weight-decay is Adagrad's own argument)
  adam               Adam / SparseAdam
  rowwise-adagrad, rowwise-adam: the rowwise ops for parameters with sparse gradients
                     (embedding tables), the plain ones for the rest
--weight-decay adds Caffe2's WeightedSum decay to the weights (not the biases) for
sgd, momentum, nesterov and adam. --lr-policy takes a LearningRate policy and
--lr-arg its arguments.

--precision (default fp32) trains in mixed precision as Caffe2's ImageNet trainer did
(caffe2/python/examples/imagenet_trainer.py): the parameters as float16 copies of float32
masters (PseudoFP16Initializer), the data cast to float16, convolutions, FCs, pools and
activations in float16, the loss in float32:
  fp16      build_fp16_sgd: float16 momentum, FP16MomentumSGDUpdate on the half weights
            (sgd, momentum, nesterov only; --weight-decay is the update op's own)
  amp-fp16  build_multi_precision_sgd: the gradient cast to float32, the update on the
            float32 master, the master cast back; adam and adagrad in the same pattern
            (placer's: Caffe2 shipped no multi-precision Adam or Adagrad)
  amp-bf16  amp-fp16 with bfloat16 casts (placer-only ops: Caffe2 cannot load the net)
Embedding tables with sparse gradients stay float32 with the plain update.
--loss-scale S starts the backward pass from S instead of 1 and divides every gradient
by S before its update (the weight decay is scaled to match). --loss-scale dynamic
(not with fp16, whose updates read half gradients) does it with a scale blob in the net: a step with an inf or NaN
gradient is skipped (each update runs in If(grads_finite)) and the scale halves; after
--loss-scale-window good steps it doubles.

example:
  placer train-net predict_net.pbtxt --init-net init_net.pbtxt --loss loss \\
      --optimizer nesterov --lr 0.1 --weight-decay 1e-4 -o train/
  placer train-net dlrm.pbtxt --loss loss --optimizer rowwise-adagrad --lr 0.01 \\
      --lr-policy step --lr-arg stepsize=1000 --lr-arg gamma=0.5 -o train/
"""



def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_arguments(parser)
    for action in parser._actions:  # a Caffe prototxt trains in its TRAIN phase
        if action.dest == "phase":
            action.default = "train"
            action.help = "Caffe include/exclude phase to keep (default: train)"
    parser.add_argument("--loss", metavar="BLOB", action="append", required=True,
                        help="the loss blob (repeat for several losses; each is seeded with 1)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, required=True)
    parser.add_argument("--lr", type=arguments.positive, required=True, metavar="LR",
                        help="base learning rate (positive)")
    parser.add_argument("--momentum", type=arguments.momentum, metavar="M",
                        help="momentum of --optimizer momentum / nesterov (default 0.9)")
    parser.add_argument("--weight-decay", type=arguments.non_negative, default=0.0, metavar="WD")
    parser.add_argument("--epsilon", type=arguments.positive, metavar="EPS",
                        help="Adagrad's / Adam's epsilon (Caffe2's defaults: 1e-4 / 1e-8)")
    parser.add_argument("--lr-policy", default="fixed", metavar="POLICY",
                        help="LearningRate policy: fixed (default), step, exp, inv, poly, ...")
    parser.add_argument("--lr-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the policy, e.g. --lr-arg stepsize=100; repeatable")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default), fp16, amp-fp16 or amp-bf16 (see above)")
    parser.add_argument("--loss-scale", type=arguments.loss_scale, metavar="S|dynamic",
                        help="static loss scale S (e.g. 1024), or dynamic (not with fp16: skip the step "
                             "and halve on an inf/NaN gradient, double after --loss-scale-window good steps)")
    parser.add_argument("--loss-scale-init", type=arguments.positive, default=65536.0, metavar="S0",
                        help="first scale of dynamic loss scaling (default 65536)")
    parser.add_argument("--loss-scale-window", type=arguments.count(1), default=2000, metavar="N",
                        help="good steps before dynamic loss scaling doubles the scale (default 2000)")
    parser.add_argument("--update-order", choices=UPDATE_ORDERS, default="after-backward",
                        help="after-backward (default: Caffe2's order) or interleaved: each update "
                             "as soon as its gradient is final, so gradients die early (ZeRO-Offload's "
                             "order; the planner's memory model follows the op order)")
    parser.add_argument("-o", "--output", metavar="OUTDIR", required=True,
                        help="folder for train_net.pbtxt and train_init_net.pbtxt")
    parser.add_argument("--binary", action="store_true", help="also write the .pb files")


def run(args: argparse.Namespace) -> int:
    choice = OptimizerChoice(args.optimizer, args.lr, momentum=args.momentum,
                             weight_decay=args.weight_decay, epsilon=args.epsilon,
                             policy=args.lr_policy,
                             policy_args=parse_lr_args(args.lr_policy, args.lr_arg),
                             precision=args.precision,
                             loss_scale=None if args.loss_scale in (None, "dynamic") else args.loss_scale,
                             dynamic_scale=DynamicScale(args.loss_scale_init, args.loss_scale_window)
                             if args.loss_scale == "dynamic" else None,
                             update_order=args.update_order)
    folder = OutputDir(check_output_dir(args.output), "-o", "train-net", inputs=(args.net, args.init_net, args.weights))
    net = load_net(args.net, init_path=args.init_net, phase=args.phase, weights=args.weights,
                   input_shapes=parse_input_specs(args.inputs))
    folder = OutputDir(args.output, "-o", "train-net")  # again: against the init net found beside NET
    result = make_train_nets(net, args.loss, choice)
    with folder:
        written = [folder.shown(p) for p in save_train_nets(folder.tmp, result.train, result.init, binary=args.binary)]
        folder.write_manifest({"source": str(args.net)})
    _print_summary(args, net, result, written)
    return 0


def _print_summary(args, net, result, written) -> None:
    n_opt = len(result.train.op) - result.forward_ops - result.gradient_ops
    sparse = f" ({len(result.sparse_params)} with sparse gradients)" if result.sparse_params else ""
    print(f"train net for {args.net}: loss {', '.join(args.loss)}; {len(result.params)} "
          f"parameters{sparse}; optimizer {args.optimizer} (lr {args.lr:g}, policy {args.lr_policy}); "
          f"rate blob(s) {', '.join(result.lr_blobs)}")
    added = Counter(op.type for op in result.train.op[result.forward_ops + result.gradient_ops:])
    print(f"  ops: {result.forward_ops} forward, {result.gradient_ops} gradient, {n_opt} optimizer "
          f"({', '.join(f'{t} {n}' for t, n in added.most_common())})")
    n_casts = len(result.masters)
    n_state = len(result.init.op) - len(net.init_proto.op) - n_casts
    casts = f" + {n_casts} casts of float32 masters to the half parameters" if n_casts else ""
    print(f"  init net: {len(net.init_proto.op)} parameter fills{casts} + {n_state} optimizer state ops")
    for note in result.notes:
        print(f"  note: {note}")
    for path in written:
        print(f"wrote {path}")
