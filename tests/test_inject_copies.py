"""``placer run --inject-copies``: the copies a net's own device options need, as real
Caffe2's ``core.InjectCrossDeviceCopies`` inserts them, and the run of the result."""
from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from placer.cli import main
from placer.formats import caffe2_pb as pb
from placer.formats import load_net
from placer.formats.caffe2 import save_netdef
from placer.ops.registry import copy_types
from placer.rewrite.netdef import inject_copies

U = float(np.finfo(np.float32).eps) / 2   # float32 unit roundoff, 2**-24

# The seed example: an FC on the CPU, Sigmoid and SoftmaxWithLoss on cuda:1, no copy ops.
SEED = '''name: "seed"
op { input: "data" input: "fc1_w" input: "fc1_b" output: "fc1" type: "FC" }
op { input: "fc1" output: "sig" type: "Sigmoid" device_option { device_type: 1 device_id: 1 } }
op { input: "sig" input: "label" output: "prob" output: "loss" type: "SoftmaxWithLoss"
     device_option { device_type: 1 device_id: 1 } }
external_input: "data" external_input: "fc1_w" external_input: "fc1_b" external_input: "label"
external_output: "loss"
'''
SEED_SHAPES = {"data": (4, 8), "fc1_w": (5, 8), "fc1_b": (5,), "label": (4,)}

# The CPU and three GPUs, blobs crossing every way: CPU -> GPU, GPU -> GPU (Copy), GPU ->
# CPU, one blob (h1) read on two GPUs, an external input (label) read on a GPU only.
MULTI = [  # (type, inputs, outputs, device: None = no device_option, else the CUDA id)
    ("FC", ["data", "w1", "b1"], ["h1"], None),
    ("Relu", ["h1"], ["r0"], 0),
    ("FC", ["r0", "w2", "b2"], ["h2"], 1),
    ("Sigmoid", ["h1"], ["s"], 2),
    ("Add", ["h2", "s"], ["a"], 1),
    ("Relu", ["a"], ["ra"], None),
    ("SoftmaxWithLoss", ["ra", "label"], ["prob", "loss"], 0),
]
MULTI_SHAPES = {"data": (4, 8), "w1": (8, 8), "b1": (8,), "w2": (8, 8), "b2": (8,), "label": (4,)}


def multi_text(devices: bool = True) -> str:
    net = pb.NetDef(name="multi", external_input=list(MULTI_SHAPES), external_output=["ra", "prob", "loss"])
    for type_, ins, outs, dev in MULTI:
        op = net.op.add(type=type_, input=ins, output=outs)
        if devices and dev is not None:
            op.device_option.device_type, op.device_option.device_id = pb.PROTO_CUDA, dev
    return text_format.MessageToString(net)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def ops_of(netdef) -> list[tuple]:
    """Every op as (type, inputs, outputs, device type, device id): no option is the CPU's."""
    return [(op.type, tuple(op.input), tuple(op.output), op.device_option.device_type,
             op.device_option.device_id) for op in netdef.op]


INJECT = '''
out = []
for text in json.loads(inputs_json):
    net = caffe2_pb2.NetDef()
    text_format.Merge(text, net)
    new, _ = core.InjectCrossDeviceCopies(core.Net(net))
    out.append([[op.type, list(op.input), list(op.output), op.device_option.device_type,
                 op.device_option.device_id] for op in new.Proto().op])
save_json(out)
'''


@pytest.mark.caffe2
def test_injected_copies_are_caffe2s_own(tmp_path):
    """The whole injected net, op by op: the copies' types, inputs, outputs, device options
    and places are those real Caffe2 inserts, and every other op is unchanged."""
    texts = [SEED, multi_text()]
    _, theirs = run_caffe2(f"inputs_json = {json.dumps(json.dumps(texts))}\n" + INJECT)
    for text, their_ops in zip(texts, theirs):
        ours = ops_of(inject_copies(load_net(write(tmp_path, "net.pbtxt", text))).proto)
        assert ours == [(t, tuple(i), tuple(o), dt, di) for t, i, o, dt, di in their_ops]
        assert sum(op[0] in copy_types() for op in ours) >= 2
    seed = ops_of(inject_copies(load_net(write(tmp_path, "seed.pbtxt", SEED))).proto)
    assert [op for op in seed if op[0] in copy_types()] == [
        ("CopyCPUToGPU", ("fc1",), ("fc1_gpu_1",), 1, 1), ("CopyCPUToGPU", ("label",), ("label_gpu_1",), 1, 1)]
    multi = ops_of(inject_copies(load_net(write(tmp_path, "multi.pbtxt", multi_text()))).proto)
    assert {op[0] for op in multi if op[0] in copy_types()} == {"CopyCPUToGPU", "Copy", "CopyGPUToCPU"}


@pytest.mark.caffe2
def test_injected_copies_are_caffe2s_own_on_random_nets_over_four_gpus(tmp_path):
    """30 random DAGs (Relu, Sigmoid, Add, FC; a blob read twice by one op, read on
    several devices, an input read on a GPU) with each op on the CPU or one of cuda:0..3:
    the same injected net as Caffe2's, op by op."""
    from test_rewrite_devices import random_net
    rng = np.random.default_rng(5)
    texts = []
    for _ in range(30):
        net = pb.NetDef()
        net.CopyFrom(random_net(rng, int(rng.integers(3, 12)), with_params=False).proto)
        for op in net.op:
            d = int(rng.integers(-1, 4))
            if d >= 0:
                op.device_option.device_type, op.device_option.device_id = pb.PROTO_CUDA, d
        texts.append(text_format.MessageToString(net))
    _, theirs = run_caffe2(f"inputs_json = {json.dumps(json.dumps(texts))}\n" + INJECT)
    kinds = set()
    for text, their_ops in zip(texts, theirs):
        ours = ops_of(inject_copies(load_net(write(tmp_path, "net.pbtxt", text))).proto)
        assert ours == [(t, tuple(i), tuple(o), dt, di) for t, i, o, dt, di in their_ops]
        kinds.update(op[0] for op in ours if op[0] in copy_types())
    assert kinds == {"CopyCPUToGPU", "CopyGPUToCPU", "Copy"}


def _inputs(shapes: dict, classes: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {name: (rng.standard_normal(shape) / np.sqrt(shape[-1] if len(shape) == 2 else 1)).astype(np.float32)
           for name, shape in shapes.items() if name != "label"}
    out["label"] = rng.integers(0, classes, shapes["label"]).astype(np.int32)
    return out


def _logit_error_bound(x: dict) -> float:
    """How far two float32 runs of MULTI's logits (``ra``) can differ when their sums run
    in another order (BLAS blocking, thread count): each FC output is an 8-term dot plus a
    bias, off by at most gamma_9 * sum|terms| (gamma_n = n u / (1 - n u)); Relu and Add are
    1-Lipschitz and Sigmoid 1/4-Lipschitz, so an error carries through them unscaled, and
    through the second FC scaled by the absolute row sums of w2; Add adds one rounding."""
    g = 9 * U / (1 - 9 * U)
    h1 = x["data"] @ x["w1"].T + x["b1"]
    e1 = g * (np.abs(x["data"]) @ np.abs(x["w1"]).T + np.abs(x["b1"]))
    r0 = np.maximum(h1, 0)
    e2 = g * (np.abs(r0) @ np.abs(x["w2"]).T + np.abs(x["b2"])) + e1 @ np.abs(x["w2"]).T
    a = r0 @ x["w2"].T + x["b2"] + 1 / (1 + np.exp(-h1))
    return float((e2 + e1 / 4 + U * np.abs(a)).max())


@pytest.mark.parametrize("gpus", [3, 4])
def test_injected_net_runs_on_emulated_gpus_as_on_the_cpu(tmp_path, capsys, gpus):
    """The injected MULTI net on emulated GPUs (3 named, then one more than it names)
    gives the all-CPU run's outputs, and its copies move blobs over the links they name."""
    x = _inputs(MULTI_SHAPES, classes=8)
    np.savez(tmp_path / "in.npz", **x)
    shapes = [f"--input={n}={','.join(map(str, s))}" + (":int32" if n == "label" else "")
              for n, s in MULTI_SHAPES.items()]
    placed = write(tmp_path, "multi.pbtxt", multi_text())
    cpu = write(tmp_path, "cpu.pbtxt", multi_text(devices=False))
    assert main(["run", placed, "--inject-copies", "--emulate-gpus", str(gpus), "--inputs", str(tmp_path / "in.npz"),
                 *shapes, "--outputs", str(tmp_path / "gpu.npz"), "--record", str(tmp_path / "run.json"),
                 "--quiet"]) == 0
    assert main(["run", cpu, "--inputs", str(tmp_path / "in.npz"), *shapes, "--outputs", str(tmp_path / "cpu.npz"),
                 "--quiet"]) == 0
    capsys.readouterr()
    # logits: the bound above; prob = softmax(ra): each p_i moves by at most 2 max|d ra| (the
    # softmax's Jacobian has absolute row sums <= 2 p_i <= 2), plus about 16 roundings (8 exps,
    # an 8-term sum, a division) of values <= 1; loss = -mean log p_label: log p_y is
    # 2-Lipschitz in ra under the max norm, plus the same roundings relative to |log p|.
    dz = _logit_error_bound(x)
    with np.load(tmp_path / "gpu.npz") as got, np.load(tmp_path / "cpu.npz") as want:
        assert sorted(got.files) == sorted(want.files) == ["loss", "prob", "ra"]
        np.testing.assert_allclose(got["ra"], want["ra"], rtol=0, atol=dz)
        np.testing.assert_allclose(got["prob"], want["prob"], rtol=0, atol=2 * dz + 16 * U)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=16 * U, atol=2 * dz)
        assert float(want["loss"]) > 0.1 and want["prob"].shape == (4, 8)
    rec = json.loads((tmp_path / "run.json").read_text())
    moved = {(o["type"], tuple(tuple(link[:2]) for link in o["links"]))
             for o in rec["ops"] if o["type"] in copy_types()}
    g = [f"emulated-cuda:{i}" for i in range(3)]
    assert moved == {("CopyCPUToGPU", (("cpu", g[0]),)), ("CopyCPUToGPU", (("cpu", g[1]),)),
                     ("CopyCPUToGPU", (("cpu", g[2]),)), ("Copy", ((g[0], g[1]),)), ("Copy", ((g[2], g[1]),)),
                     ("CopyGPUToCPU", ((g[1], "cpu"),))}
    assert len(rec["devices"]) == gpus + 1


def test_without_the_option_the_error_is_one_line_naming_it(tmp_path, capsys):
    net = write(tmp_path, "seed.pbtxt", SEED)
    shapes = [f"--input={n}={','.join(map(str, s))}" + (":int32" if n == "label" else "")
              for n, s in SEED_SHAPES.items()]
    rc = main(["run", net, *shapes, "--emulate-gpus", "2", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("placer: error: ") and "Traceback" not in out + err
    assert "'fc1'" in err and "CopyCPUToGPU" in err and "--inject-copies" in err
    assert main(["run", net, *shapes, "--emulate-gpus", "2", "--quiet", "--inject-copies",
                 "--outputs", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as got:
        assert got["loss"].shape == () and np.isfinite(got["loss"])


def test_a_net_with_copy_ops_already_is_refused(tmp_path, capsys):
    placed = inject_copies(load_net(write(tmp_path, "seed.pbtxt", SEED)))
    path = tmp_path / "placed.pbtxt"
    save_netdef(placed.proto, str(path))
    rc = main(["run", str(path), "--inject-copies", "--emulate-gpus", "2", "--quiet"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1
    assert "--inject-copies" in err and "#1 CopyCPUToGPU" in err and str(path) in err


def test_a_net_without_device_options_is_left_as_it_is(tmp_path):
    net = load_net(write(tmp_path, "cpu.pbtxt", multi_text(devices=False)))
    assert inject_copies(net) is net


def test_parameters_of_an_init_net_are_filled_where_they_are_read(tmp_path, capsys):
    """Unlike Caffe2, which would copy fc1_w and fc1_b to cuda:1 on every run, the injected
    net fills them on cuda:1 once (the init net's fills move there); the run still gives
    the CPU's loss."""
    text = SEED.replace('type: "FC" }', 'type: "FC" device_option { device_type: 1 device_id: 1 } }')
    init = ('op { output: "fc1_w" type: "XavierFill" arg { name: "shape" ints: 5 ints: 8 } }\n'
            'op { output: "fc1_b" type: "ConstantFill" arg { name: "shape" ints: 5 } arg { name: "value" f: 0.1 } }\n')
    net = load_net(write(tmp_path, "seed.pbtxt", text), init_path=write(tmp_path, "init.pbtxt", init))
    injected = inject_copies(net)
    copies = [(op.type, op.inputs[0]) for op in injected.ops if op.type in copy_types()]
    assert copies == [("CopyCPUToGPU", "data"), ("CopyCPUToGPU", "label")]
    assert [(op.type, op.device_option.device_type, op.device_option.device_id) for op in injected.init_proto.op] == [
        ("XavierFill", 1, 1), ("ConstantFill", 1, 1)]
    shapes = ["--input=data=4,8", "--input=label=4:int32"]
    x = _inputs({"data": (4, 8), "label": (4,)}, classes=5)
    np.savez(tmp_path / "in.npz", **x)
    run = ["--init-net", str(tmp_path / "init.pbtxt"), "--inputs", str(tmp_path / "in.npz"), *shapes, "--quiet"]
    assert main(["run", str(tmp_path / "seed.pbtxt"), "--inject-copies", "--emulate-gpus", "2", *run,
                 "--outputs", str(tmp_path / "gpu.npz")]) == 0
    cpu = write(tmp_path, "cpu.pbtxt", SEED.replace(" device_option { device_type: 1 device_id: 1 }", ""))
    assert main(["run", cpu, *run, "--outputs", str(tmp_path / "cpu.npz")]) == 0
    capsys.readouterr()
    # The same seeded fills on both runs (a fill's values come from the run's seed and its
    # output name, not its device). The loss: an FC of 8 terms and a bias, off by at most
    # gamma_9 * (8 max|w| max|x| + |b|), with |w| <= sqrt(3 / 8) (XavierFill's uniform limit
    # for fan-in 8) and b = 0.1; Sigmoid is 1/4-Lipschitz and the log-softmax 2-Lipschitz;
    # plus about 16 roundings relative to the loss.
    g = 9 * U / (1 - 9 * U)
    dz = g * (8 * np.sqrt(3 / 8) * float(np.abs(x["data"]).max()) + 0.1) / 4
    with np.load(tmp_path / "gpu.npz") as got, np.load(tmp_path / "cpu.npz") as want:
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=16 * U, atol=2 * dz)
        assert float(want["loss"]) > 0.1


def test_a_cluster_plan_is_not_injected(tmp_path, capsys):
    rc = main(["run", str(tmp_path), "--ray", "--inject-copies", "--quiet"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and "--inject-copies" in err and "cluster plan" in err
