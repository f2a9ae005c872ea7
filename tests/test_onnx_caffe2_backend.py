"""ONNX models converted by placer against Caffe2's own ONNX backend (torch 1.8.1, opset 9)
and ONNX Runtime.

Small PyTorch models covering the ops of exported CNNs are exported here at opset 9 (the
opset Caffe2's backend targets). For each:
- Caffe2's backend maps placer's folded graph (``formats.onnx.folded_model``: the same
  nodes placer maps) and its NetDef equals placer's op for op, up to the names of
  intermediate blobs and up to arguments left at Caffe2's defaults. Two differences are
  deliberate: Caffe2's backend reads a Reshape's shape and ResizeNearest's scales from
  blobs and computes a Slice's starts and ends at run time (Shape, GivenTensor*Fill,
  ConstantFill and ScatterAssign before the Slice, with ONNX's negative ends misread as
  Caffe2's inclusive ones), where placer gives the folded values as arguments: the ops that
  make those blobs are left out of the comparison, and these three ops compare by their
  data input. (Caffe2 also refuses to construct a global pool whose op name holds "Pool",
  as exporters name them: placer's names avoid it, and the oracle's copy of the model
  drops node names so that Caffe2's backend can run it.)
- real Caffe2 runs the original model (its backend), placer's converted NetDefs, and the
  net placer places on a T4 (every device mapped to the CPU), all with ONNX Runtime's
  outputs, as does placer's own run of the placed net on an emulated GPU.

Tolerance: rtol 1e-4 with atol 1e-5 of the output's largest magnitude. The nets are a few
float32 layers with dot products of at most 600 terms; two correct float32 evaluations in
different orders differ by about sqrt(600) * 6e-8 ~ 1.5e-6 relative, so 1e-4 leaves a wide
margin while catching any wrong mapping (a padding, axis or transposition error moves
outputs by 1e-2 or more).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from google.protobuf import text_format
from test_training_run_placed import on_the_cpu

from placer import cli
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.formats.onnx import convert_onnx, folded_model
from placer.runtime.executor import Executor

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn, F = torch.nn, torch.nn.functional

pytestmark = [pytest.mark.caffe2, pytest.mark.torch]
RTOL = 1e-4


def close(got, want, what):
    want = np.asarray(want)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=1e-5 * max(scale, 1e-30), err_msg=what)


class Cnn(nn.Module):
    """Conv (padding, stride, groups, dilation), a BatchNormalization the exporter cannot
    fold into a Conv, ReLU6 (Clip), pools, a residual Add, Concat, Flatten, Gemm, Softmax."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=1, padding=2, dilation=2, groups=2)
        self.c3 = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(12 * 4 * 4, 10)

    def forward(self, x):
        y = self.bn(F.relu(self.c1(x)))
        y = F.relu6(self.c2(y)) + y
        y = F.max_pool2d(y, 3, stride=2, padding=1)
        z = F.avg_pool2d(y, 3, stride=1, padding=1, count_include_pad=False)
        y = torch.cat([self.c3(y), z], 1)
        y = F.avg_pool2d(y, 2)
        return torch.softmax(self.fc(torch.flatten(y, 1)), 1)


class Blocks(nn.Module):
    """The activations and layout ops of MobileNet/ShuffleNet-style nets: LeakyReLU,
    Sigmoid-gated Mul (SiLU), Tanh, ConvTranspose, nearest Upsample, Pad, Transpose,
    Reshape, Slice, a global average pool and a LogSoftmax."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1)
        self.c2 = nn.Conv2d(6, 6, 3)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        y = F.leaky_relu(self.c1(x), 0.1)
        y = y * torch.sigmoid(y)
        y = torch.tanh(self.up(y))
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        y = F.pad(y, (1, 2, 0, 1))
        n, c, h, w = y.shape
        y = y.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)  # channel shuffle
        y = self.c2(y[:, :, 1:h, 0:w - 1])  # ends in range: Caffe2's backend misreads negative and huge ones
        y = F.adaptive_avg_pool2d(y, 1).flatten(1)
        return F.log_softmax(self.fc(y), dim=1)


MODELS = {"cnn": (Cnn, (2, 3, 16, 16)), "blocks": (Blocks, (1, 4, 12, 12))}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, tmp_path_factory):
    name = request.param
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():  # BN statistics that are not the identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    d = tmp_path_factory.mktemp(name)
    path = d / f"{name}.onnx"
    x = torch.randn(*shape)
    torch.onnx.export(model, (x,), str(path), opset_version=9, dynamo=False, input_names=["x"],
                      output_names=["y"])
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    want = ort.InferenceSession(str(path)).run(None, feeds)[0]
    conv = convert_onnx(path)
    folded = folded_model(path)
    return dict(name=name, path=path, dir=d, feeds=feeds, want=want, conv=conv, folded=folded)


ORACLE = """
import onnx
from caffe2.python.onnx.backend import Caffe2Backend
def old_style(model):
    # onnx 1.8.1 reads IR <= 7 and its optimizer wants initializers listed as graph inputs
    model.ir_version = min(model.ir_version, 6)
    listed = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.name not in listed:
            model.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return model
folded = old_style(onnx.load_model_from_string(inputs["folded"].tobytes()))
init, pred = Caffe2Backend.onnx_graph_to_caffe2_net(folded, device="CPU", opset_version=9)
def arg(a):
    if a.HasField("f"): return a.f
    if a.HasField("i"): return a.i
    if a.HasField("s"): return a.s.decode()
    return list(a.ints) or list(a.floats)
ops = [[o.type, list(o.input), list(o.output), {a.name: arg(a) for a in o.arg}] for o in pred.op]
original = old_style(onnx.load_model_from_string(inputs["original"].tobytes()))
for node in original.graph.node:  # Caffe2 refuses a global pool whose op name holds "Pool"
    node.name = ""
rep = Caffe2Backend.prepare(original, device="CPU")
out = {"backend": rep.run([inputs["x"]])[0]}
for key in ("ours", "placed"):
    p, i = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    p.ParseFromString(inputs[key + "_predict"].tobytes())
    i.ParseFromString(inputs[key + "_init"].tobytes())
    workspace.ResetWorkspace()
    workspace.RunNetOnce(i)
    workspace.FeedBlob("x", inputs["x"])
    workspace.RunNetOnce(p)
    out[key] = workspace.FetchBlob(p.external_output[0])
save(**out)
save_json(ops)
"""

# Arguments Caffe2 takes by default: present on one side and absent on the other is the same op.
DEFAULTS = {"dilations": [1, 1], "group": 1, "pads": [0, 0, 0, 0], "strides": [1, 1], "count_include_pad": 0,
            "value": 0.0}  # PadImage's fill


def _args(op_args: dict) -> dict:
    return {k: v for k, v in op_args.items() if DEFAULTS.get(k, object()) != v}


def _ours(netdef) -> list:
    out = []
    for o in netdef.op:
        args = {a.name: (a.f if a.HasField("f") else a.i if a.HasField("i") else
                         a.s.decode() if a.HasField("s") else list(a.ints) or list(a.floats)) for a in o.arg}
        out.append([o.type, list(o.input), list(o.output), args])
    return out


def _bytes(netdef) -> np.ndarray:
    return np.frombuffer(netdef.SerializeToString(), dtype=np.uint8)


@pytest.fixture(scope="module")
def oracle(case):
    d = case["dir"]
    placed, placed_init = d / "placed.pbtxt", d / "placed_init.pbtxt"
    # the convolutions pinned to the GPU, so the placed net has copies both ways
    assert cli.main(["plan", str(case["path"]), "--gpu-profile", "t4-pcie3", "--pin", "Conv=cuda:0", "-o", str(placed),
                     "--init-out", str(placed_init)]) == 0
    p, i = pb.NetDef(), pb.NetDef()
    text_format.Parse(placed.read_text(), p)
    text_format.Parse(placed_init.read_text(), i)
    arrays, ops = run_caffe2(ORACLE, {
        "x": case["feeds"]["x"],
        "folded": np.frombuffer(case["folded"].SerializeToString(), dtype=np.uint8),
        "original": np.frombuffer(case["path"].read_bytes(), dtype=np.uint8),
        "ours_predict": _bytes(case["conv"].predict), "ours_init": _bytes(case["conv"].init),
        "placed_predict": _bytes(on_the_cpu(p)), "placed_init": _bytes(on_the_cpu(i))}, onnx=True)
    return dict(arrays=arrays, ops=ops, placed=(p, i))


# Inputs that Caffe2's backend computes at run time and placer gives as arguments.
RUN_TIME_ARGS = {"Slice": 1, "ResizeNearest": 1, "Reshape": 1}   # op type -> first such input
ARG_MAKERS = {"Shape", "GivenTensorIntFill", "GivenTensorInt64Fill", "ConstantFill", "ScatterAssign", "Slice"}


def _without_run_time_args(ops: list) -> list:
    """Caffe2's ops less those that only compute another op's run-time arguments (a Slice's
    bounds, ResizeNearest's scales: see the module doc), and those inputs."""
    wanted = {b for t, ins, _, _ in ops if t in RUN_TIME_ARGS for b in ins[RUN_TIME_ARGS[t]:]}
    keep = []
    for t, ins, outs, args in reversed(ops):
        if t in ARG_MAKERS and set(outs) <= wanted:
            if t != "Shape":  # Shape reads a data blob for its shape only
                wanted.update(ins)
            continue
        if t in RUN_TIME_ARGS:
            ins = ins[:RUN_TIME_ARGS[t]]
        keep.append([t, ins, outs, args])
    return keep[::-1]


def test_the_netdef_equals_caffe2_backends_op_for_op(case, oracle):
    theirs, ours = _without_run_time_args(oracle["ops"]), _ours(case["conv"].predict)
    assert [o[0] for o in ours] == [o[0] for o in theirs], json.dumps([o[0] for o in theirs])
    names: dict[str, str] = {}   # placer's blob -> Caffe2's, for the names each side makes up
    for k, ((t, ins, outs, args), (_, c_ins, c_outs, c_args)) in enumerate(zip(ours, theirs)):
        if t in RUN_TIME_ARGS:  # compared by their data input; their arguments are placer's own
            ins, args, c_args = ins[:RUN_TIME_ARGS[t]], {}, {}
        assert [names.get(b, b) for b in ins] == c_ins, f"op {k} {t}: inputs"
        assert len(outs) == len(c_outs), f"op {k} {t}: outputs"
        for a, b in zip(outs, c_outs):
            assert names.setdefault(a, b) == b, f"op {k} {t}: output {a}"
        ours_args, their_args = _args(args), _args(c_args)
        assert ours_args.keys() == their_args.keys(), f"op {k} {t}: arguments {ours_args} vs {their_args}"
        for a in ours_args:
            if isinstance(ours_args[a], str):
                assert ours_args[a] == their_args[a], f"op {k} {t} {a}"
            else:  # float arguments went through float32 on both sides
                np.testing.assert_allclose(ours_args[a], their_args[a], rtol=1e-6, err_msg=f"op {k} {t} {a}")
    # every name that is not made up on both sides is the model's own
    assert all(a == b for a, b in names.items() if not b.startswith("OC2_DUMMY"))


def test_caffe2_runs_the_model_and_placers_nets_with_onnx_runtimes_outputs(case, oracle):
    got = oracle["arrays"]
    close(got["backend"], case["want"], "Caffe2's backend on the model")
    close(got["ours"], case["want"], "Caffe2 running placer's converted NetDefs")
    close(got["placed"], case["want"], "Caffe2 running the placed nets, devices on the CPU")


def test_placers_runs_of_the_converted_and_placed_nets_match_onnx_runtime(case, oracle):
    ex = Executor(net_from_netdef(case["conv"].predict, case["conv"].init))
    ex.run_init()
    close(ex.run(case["feeds"], warmup=0)["y"], case["want"], "placer's run")
    p, i = oracle["placed"]
    assert {"CopyCPUToGPU", "CopyGPUToCPU"} <= {o.type for o in p.op}
    ex = Executor(net_from_netdef(p, i), emulate_gpu=True)
    ex.run_init()
    close(ex.run(case["feeds"], warmup=0)["y"], case["want"], "placer's run of the placed net")
