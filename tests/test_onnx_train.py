"""``placer train-net model.onnx --loss loss`` on a CNN exported from PyTorch with its loss
(F.cross_entropy becomes ONNX SoftmaxCrossEntropyLoss, mapped to Caffe2's SoftmaxWithLoss):
the train net placer writes trains as PyTorch trains the same module.

The oracle is PyTorch itself: the module, with the same initial weights, trained with
torch.optim.SGD(momentum=0.9) on the same batches. Caffe2's MomentumSGDUpdate keeps
``m = momentum * m + lr * g`` and steps by ``m``, which is PyTorch's ``v = momentum * v + g``
scaled by a constant lr, so the losses of every step agree up to float32 rounding. Ten
steps of a net of ~1e4 multiply-adds per output drift by a few 1e-6 relative; rtol 1e-4
catches a wrong gradient (which moves the second loss by 1e-2 or more).
"""
from __future__ import annotations

import numpy as np
import pytest

from placer import cli
from placer.formats.caffe2 import load_caffe2_net
from placer.runtime.executor import Executor

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional
pytestmark = pytest.mark.torch

STEPS, LR, MOMENTUM = 10, 0.1, 0.9


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x, label):
        y = F.max_pool2d(F.relu(self.c1(x)), 2)
        y = F.relu6(self.c2(y)) + F.avg_pool2d(y, 2)
        return F.cross_entropy(self.fc(torch.flatten(y, 1)), label)


def test_train_net_of_an_onnx_cnn_trains_as_pytorch_does(tmp_path, capsys):
    torch.manual_seed(0)
    module = WithLoss()
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 3, 16, 16)).astype(np.float32), rng.integers(0, 5, 4))
               for _ in range(STEPS)]
    path = tmp_path / "cnn.onnx"
    torch.onnx.export(module, (torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1])), str(path),
                      opset_version=17, dynamo=False, input_names=["x", "label"], output_names=["loss"],
                      do_constant_folding=False)
    assert cli.main(["train-net", str(path), "--loss", "loss", "--optimizer", "momentum", "--lr", str(LR),
                     "--momentum", str(MOMENTUM), "-o", str(tmp_path / "train")]) == 0
    assert "SoftmaxWithLoss" in (tmp_path / "train" / "train_net.pbtxt").read_text()
    capsys.readouterr()

    net = load_caffe2_net(tmp_path / "train" / "train_net.pbtxt", tmp_path / "train" / "train_init_net.pbtxt")
    ex = Executor(net)
    ours = []
    ex.run(lambda step: {"x": batches[step][0], "label": batches[step][1]}, iterations=STEPS, warmup=0,
           watch=["loss"], on_step=lambda step, values: ours.append(float(values["loss"])))

    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
    theirs = []
    for x, label in batches:
        opt.zero_grad()
        loss = module(torch.from_numpy(x), torch.from_numpy(label))
        loss.backward()
        opt.step()
        theirs.append(float(loss))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert ours[-1] < ours[0]  # and it learns (seeded batches: the same figures on every machine)
