"""Quantized whole nets (placer.examples.quantize): a ResNet-style net with SpatialBN folded,
the bundled resnet_tiny_int8, a net of the other converted ops (Flatten, Reshape, Concat,
Relu, Softmax in float and Int8) and corpus Caffe nets (LeNet, SqueezeNet, MobileNet,
ResNet-50) turned into Caffe2's Int8 form, then inspected, planned (Int8 ops on the CPU),
run in placer's Executor and in real Caffe2 (every Int8 blob bit for bit, the dequantized
outputs exactly), compared with the float net (tolerances in quantization steps), and run
placed in Caffe2; the ops' scale limits, and the nets it refuses."""
from __future__ import annotations

import json

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from conftest import corpus_dir
from google.protobuf import text_format
from test_training_run_placed import on_the_cpu

from placer import cli, shapes
from placer.errors import ArgumentError
from placer import examples
from placer.examples import quantize as qz
from placer.examples import resnet
from placer.formats import caffe2_pb as pb
from placer.formats import load_net
from placer.formats.caffe2 import net_from_netdef
from placer.ops.int8_base import Int8Tensor
from placer.runtime.executor import Executor
from placer.types import TensorType

BATCH, IMAGE = 4, 32
CFG = resnet.ResNetConfig(name="resnet_int8", batch=BATCH, image=IMAGE, widths=(8, 16, 32),
                          blocks_per_stage=1, classes=10)


def _randomised_bn(params: dict, rng) -> dict:
    """The builder's BN params are the identity (scale 1, mean 0, var 1): give them values a
    trained net has, so that folding them changes the weights."""
    out = dict(params)
    for k, v in params.items():
        draw = {"_bn_s": (0.5, 1.5), "_bn_b": (-0.3, 0.3), "_bn_rm": (-0.3, 0.3), "_bn_riv": (0.5, 2.0)}
        for suffix, (lo, hi) in draw.items():
            if k.endswith(suffix):
                out[k] = rng.uniform(lo, hi, v.shape).astype(np.float32)
        if k == "pred_b":
            out[k] = rng.uniform(-0.1, 0.1, v.shape).astype(np.float32)
    return out


def _batches(rng, shape, n):
    return [{"data": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _given_init(params: dict) -> pb.NetDef:
    init = pb.NetDef(name="float_weights")
    for name, v in params.items():
        op = init.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=list(v.shape))
        op.arg.add(name="values", floats=np.asarray(v, np.float32).ravel().tolist())
    return init


@pytest.fixture(scope="module")
def resnet_case():
    rng = np.random.default_rng(11)
    b = resnet.build(CFG)
    params = {k: np.asarray(v) for k, v in Executor(net_from_netdef(b.predict, b.init)).run_init().items()}
    params = _randomised_bn(params, rng)
    init = _given_init(params)
    calibration = _batches(rng, (BATCH, 3, IMAGE, IMAGE), 4)
    p8, i8 = qz.quantize(b.predict, init, calibration)
    test = _batches(rng, (BATCH, 3, IMAGE, IMAGE), 3)
    return dict(predict=b.predict, init=init, p8=p8, i8=i8, calibration=calibration, test=test,
                logits="pred", output="softmax")


@pytest.fixture(scope="module")
def lenet_case():
    path = corpus_dir() / "caffe" / "mnist_lenet.prototxt"
    net = load_net(path, input_shapes={"data": TensorType((BATCH, 1, 28, 28))})
    rng = np.random.default_rng(12)
    params = {k: np.asarray(v) for k, v in Executor(net).run_init().items()}
    init = _given_init(params)
    calibration = _batches(rng, (BATCH, 1, 28, 28), 4)
    p8, i8 = qz.quantize(net.proto, init, calibration)
    return dict(predict=net.proto, init=init, p8=p8, i8=i8, calibration=calibration,
                test=_batches(rng, (BATCH, 1, 28, 28), 3), logits="ip2", output="prob")


def _types(netdef) -> list[str]:
    return [op.type for op in netdef.op]


# ---------------------------------------------------------------- the layout of the Int8 nets

def test_the_resnet_int8_net_has_caffe2s_int8_layout(resnet_case):
    types = _types(resnet_case["p8"])
    assert types[:2] == ["NCHW2NHWC", "Int8Quantize"]
    assert types[-2:] == ["Int8Dequantize", "Softmax"]          # the float tail
    assert "SpatialBN" not in types and "Relu" not in types and "Int8Relu" not in types
    assert types.count("Int8ConvRelu") == 4 and types.count("Int8SumRelu") == 3   # fused
    assert types.count("Int8Conv") == 5 and {"Int8MaxPool", "Int8AveragePool", "Int8FC"} <= set(types)
    init_types = {op.type for op in resnet_case["i8"].op}
    assert init_types == {"Int8GivenTensorFill", "Int8GivenIntTensorFill"}
    # weights NHWC (M, kH, kW, C), biases at x_scale * w_scale with zero point 0
    fills = {op.output[0]: {a.name: a for a in op.arg} for op in resnet_case["i8"].op}
    assert list(fills["conv1_w"]["shape"].ints) == [8, 7, 7, 3]
    scales = {op.output[0]: (o.f, o2.i) for op in resnet_case["p8"].op for o in op.arg
              if o.name == "Y_scale" for o2 in op.arg if o2.name == "Y_zero_point"}
    x_scale = scales["data_int8"][0]
    assert fills["conv1_b"]["Y_scale"].f == pytest.approx(x_scale * fills["conv1_w"]["Y_scale"].f, rel=1e-6)
    assert fills["conv1_b"]["Y_zero_point"].i == 0
    assert all(0 <= zp <= 255 for _, zp in scales.values())
    assert scales["conv1_bn"][1] == 0                            # a Relu output: zero point 0


def test_lenet_int8_keeps_the_relu_after_an_fc_and_permutes_the_fc_weights(lenet_case):
    types = _types(lenet_case["p8"])
    assert types == ["NCHW2NHWC", "Int8Quantize", "Int8Conv", "Int8MaxPool", "Int8Conv", "Int8MaxPool",
                     "Int8FC", "Int8Relu", "Int8FC", "Int8Dequantize", "Softmax"]


def test_what_cannot_be_converted_is_one_line_naming_the_op():
    path = corpus_dir() / "caffe" / "bvlc_alexnet_deploy.prototxt"
    net = load_net(path, input_shapes={"data": TensorType((1, 3, 67, 67))})
    with pytest.raises(ArgumentError, match=r"op #\d+ LRN 'norm1': LRN has no Int8 form") as e:
        qz.quantize(net.proto, net.init_proto, _batches(np.random.default_rng(0), (1, 3, 67, 67), 1))
    assert "\n" not in str(e.value)
    b = resnet.build(CFG)
    train_bn = pb.NetDef()
    train_bn.CopyFrom(b.predict)
    for op in train_bn.op:
        if op.type == "SpatialBN":
            for a in op.arg:
                if a.name == "is_test":
                    a.i = 0
    with pytest.raises(ArgumentError, match="SpatialBN.*training mode"):
        qz.quantize(train_bn, b.init, _batches(np.random.default_rng(0), (1, 3, IMAGE, IMAGE), 1))


# ---------------------------------------------------------------- folding and calibration

def test_batchnorm_folding_keeps_the_float_net(resnet_case):
    """The folded float net against the net with SpatialBN, both in placer's Executor:
    the same function up to float32 rounding (a few ulps of the logits, whose size is ~1)."""
    ex = Executor(net_from_netdef(resnet_case["predict"], resnet_case["init"]))
    folded = qz.prepare(resnet_case["predict"], resnet_case["init"])
    fp, fi = qz.float_netdefs(folded)
    assert "SpatialBN" not in _types(fp)
    exf = Executor(net_from_netdef(fp, fi))
    for batch in resnet_case["test"]:
        seen = {}
        ex.run(batch, warmup=0, watch=["pred"], on_step=lambda s, v: seen.update(v))
        want = seen["pred"]
        exf.run(batch, warmup=0, watch=["pred"], on_step=lambda s, v: seen.update(v))
        np.testing.assert_allclose(seen["pred"], want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_the_init_net_is_run_as_the_executor_runs_it():
    """quantize runs the init net itself when no params are given: the same values as
    placer's Executor (random fills seeded alike)."""
    b = resnet.build(CFG)
    ours = qz.run_init(b.init)
    theirs = Executor(net_from_netdef(b.predict, b.init)).run_init()
    assert set(ours) == set(theirs)
    for k, v in theirs.items():
        np.testing.assert_array_equal(ours[k], np.asarray(v), err_msg=k)


def test_calibration_ranges_are_the_executors(resnet_case):
    """The ranges quantize computes with placer's kernels are those of placer's Executor
    run (watching every activation) on the same batches."""
    folded = qz.prepare(resnet_case["predict"], resnet_case["init"])
    ranges, _ = qz.activation_ranges(folded, resnet_case["calibration"])
    fp, fi = qz.float_netdefs(folded)
    names = sorted(ranges)
    lo, hi = {}, {}

    def step(_, values):
        for n in names:
            lo[n] = min(lo.get(n, np.inf), float(values[n].min()))
            hi[n] = max(hi.get(n, -np.inf), float(values[n].max()))
    ex = Executor(net_from_netdef(fp, fi))
    for batch in resnet_case["calibration"]:
        ex.run(batch, warmup=0, watch=names, on_step=step)
    assert {n: (lo[n], hi[n]) for n in names} == ranges


# ---------------------------------------------------------------- inspect and plan

def _write(tmp_path, case, stem):
    pred, init = tmp_path / f"{stem}.pbtxt", tmp_path / f"{stem}_init.pbtxt"
    pred.write_text(text_format.MessageToString(case["p8"]))
    init.write_text(text_format.MessageToString(case["i8"]))
    return pred, init


@pytest.mark.parametrize("which", ["resnet_case", "lenet_case"])
def test_inspect_knows_every_op_and_plan_pins_int8_to_the_cpu(which, request, tmp_path, capsys):
    case = request.getfixturevalue(which)
    pred, init = _write(tmp_path, case, "q")
    shape = case["test"][0]["data"].shape
    net = net_from_netdef(case["p8"], case["i8"])
    typed = shapes.infer(net, {"data": TensorType(shape)})
    assert all(t is not None for t in typed.blobs.values())
    assert cli.main(["inspect", str(pred), "--init-net", str(init), "--input",
                     "data=" + ",".join(map(str, shape))]) == 0
    out = capsys.readouterr().out
    assert "unknown op types: none" in out
    placed, placed_init = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pbtxt"
    base = ["plan", str(pred), "--init-net", str(init), "--input", "data=" + ",".join(map(str, shape)),
            "--gpu-profile", "t4-pcie3", "--json"]
    for pins in ([], ["--pin", f"{case['output']}=cuda:0"]):
        assert cli.main(base + pins + ["-o", str(placed), "--init-out", str(placed_init)]) == 0
        doc = json.loads(capsys.readouterr().out)
        devices = {o["type"]: set() for o in doc["ops"]}
        for o in doc["ops"]:
            devices[o["type"]].add(o["device"])
        assert all(devs == {"cpu"} for t, devs in devices.items() if t.startswith("Int8")), devices
        assert len(doc["ops"]) == len(case["p8"].op) and placed.exists() and placed_init.exists()
    assert devices["Softmax"] == {"cuda:0"}                 # the float tail may go to the GPU
    # an Int8 op pinned to the GPU is refused, naming it (Caffe2 has no CUDA Int8 kernel)
    assert cli.main(base + ["--pin", f"{case['logits']}=cuda:0"]) != 0
    err = capsys.readouterr().err
    assert "Int8FC" in err and "no GPU kernel" in err


# ---------------------------------------------------------------- placer against real Caffe2

CAFFE2_SCRIPT = """
out, quant = {}, {}
for key in KEYS:
    init, predict = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    init.ParseFromString(inputs[key + "/init"].tobytes())
    predict.ParseFromString(inputs[key + "/predict"].tobytes())
    for b in range(BATCHES):
        workspace.ResetWorkspace()
        workspace.RunNetOnce(init)
        workspace.FeedBlob("data", inputs["data%d" % b])
        workspace.RunNetOnce(predict)
        for name in FLOATS[key]:
            out["%s/%d/%s" % (key, b, name)] = workspace.FetchBlob(name)
        for name in INT8S[key]:
            data, scale, zp = workspace.FetchInt8Blob(name)
            out["%s/%d/%s" % (key, b, name)] = data
            quant["%s/%d/%s" % (key, b, name)] = [float(scale), int(zp)]
save(**out)
save_json(quant)
"""


def _caffe2(nets: dict, batches: list, floats: dict, int8s: dict):
    arrays = {f"data{i}": b["data"] for i, b in enumerate(batches)}
    for key, (predict, init) in nets.items():
        arrays[f"{key}/predict"] = np.frombuffer(predict.SerializeToString(), np.uint8)
        arrays[f"{key}/init"] = np.frombuffer(init.SerializeToString(), np.uint8)
    script = (f"KEYS = {list(nets)!r}\nBATCHES = {len(batches)}\nFLOATS = {floats!r}\n"
              f"INT8S = {int8s!r}\n" + CAFFE2_SCRIPT)
    return run_caffe2(script, arrays)


def _int8_blobs(p8) -> list[str]:
    """Every Int8 activation the net writes (the ops' outputs but the float ones)."""
    return [op.output[0] for op in p8.op if op.type.startswith("Int8") and op.type != "Int8Dequantize"]


def _ours(p8, i8, batch, watch):
    seen = {}
    out = Executor(net_from_netdef(p8, i8)).run(batch, warmup=0, watch=watch,
                                                on_step=lambda s, v: seen.update(v))
    return {**seen, **out}


def _check_against_caffe2(case, tmp_path=None):
    p8, i8 = case["p8"], case["i8"]
    logits = case["logits"]
    int8s = _int8_blobs(p8)
    floats = [f"{logits}_float", case["output"]]
    fp, fi = qz.float_netdefs(qz.prepare(case["predict"], case["init"]))
    nets = {"int8": (p8, i8), "float": (fp, fi)}
    want, quant = _caffe2(nets, case["test"], {"int8": floats, "float": [logits, case["output"]]},
                          {"int8": int8s, "float": []})
    for b, batch in enumerate(case["test"]):
        got = _ours(p8, i8, batch, int8s + floats)
        for name in int8s:
            key = f"int8/{b}/{name}"
            t = got[name]
            assert isinstance(t, Int8Tensor)
            assert (t.scale, t.zero_point) == (float(np.float32(quant[key][0])), quant[key][1]), name
            np.testing.assert_array_equal(t.data, want[key], err_msg=f"Int8 blob {name}, batch {b}")
        # the dequantized logits: the same integers, one float32 multiply each: exact
        name = f"{logits}_float"
        np.testing.assert_array_equal(got[name], want[f"int8/{b}/{name}"])
        # the float tail (Softmax): float32 exp and sums in Caffe2's order vs numpy's:
        # probabilities within a few float32 ulps of 1
        np.testing.assert_allclose(got[case["output"]], want[f"int8/{b}/{case['output']}"], rtol=0,
                                   atol=4 * np.finfo(np.float32).eps)
    return want


@pytest.mark.caffe2
@pytest.mark.parametrize("which", ["resnet_case", "lenet_case"])
def test_int8_nets_run_in_placer_as_in_caffe2_bit_for_bit(which, request):
    case = request.getfixturevalue(which)
    want = _check_against_caffe2(case)
    # the quantized logits against the float net's (the folded float net, run in Caffe2).
    # Each requantization rounds to within half a step of its own scale and the errors add
    # up through the layers, and test data may pass the calibration range (saturating):
    # the mean error stays within 2 steps of the logits' scale, the worst within 10% of
    # their range; the input-dependent part of the logits (less each class's mean over the
    # samples: a random-weight net favours few classes) keeps a correlation of 0.98 or
    # more, and the top-1 class agrees on most samples.
    logits = case["logits"]
    scale = next(a.f for op in case["p8"].op if op.output[0] == logits for a in op.arg if a.name == "Y_scale")
    q = np.concatenate([want[f"int8/{b}/{logits}_float"] for b in range(len(case["test"]))])
    f = np.concatenate([want[f"float/{b}/{logits}"] for b in range(len(case["test"]))])
    err = np.abs(q - f) / scale
    assert err.mean() <= 2.0, f"mean logit error {err.mean():.2f} output steps"
    assert err.max() * scale <= 0.1 * (f.max() - f.min()), f"max logit error {err.max():.2f} steps"
    centred = np.corrcoef((f - f.mean(0)).ravel(), (q - f.mean(0)).ravel())[0, 1]
    assert centred >= 0.98, centred
    agree = int(np.sum(q.argmax(1) == f.argmax(1)))
    assert agree >= 0.75 * len(q), f"top-1 agrees on {agree} of {len(q)}"


@pytest.mark.caffe2
def test_corpus_squeezenet_and_mobilenet_int8_match_caffe2():
    """SqueezeNet (Concat of Fire modules, Dropout dropped, global average pool) and
    MobileNet (depthwise convs, BatchNorm + Scale folded) at 64 x 64."""
    for stem in ("squeezenet_v1.0_deploy", "mobilenet_deploy"):
        net = load_net(corpus_dir() / "caffe" / f"{stem}.prototxt",
                       input_shapes={"data": TensorType((1, 3, 64, 64))})
        rng = np.random.default_rng(13)
        params = {k: np.asarray(v) for k, v in Executor(net).run_init().items()}
        params = {k: (rng.uniform(0.5, 1.5, v.shape).astype(np.float32) if k.endswith("bn_riv") else v)
                  for k, v in params.items()}
        init = _given_init(params)
        calibration = _batches(rng, (1, 3, 64, 64), 2)
        p8, i8 = qz.quantize(net.proto, init, calibration)
        logits = next(op.input[0] for op in net.proto.op if op.type == "Softmax")
        case = dict(predict=net.proto, init=init, p8=p8, i8=i8, test=_batches(rng, (1, 3, 64, 64), 1),
                    logits=logits, output="prob")
        _check_against_caffe2(case)


# ---------------------------------------------------------------- a placed Int8 net in Caffe2

@pytest.mark.caffe2
def test_a_placed_int8_net_runs_in_caffe2_with_the_same_outputs(resnet_case, tmp_path, capsys):
    """Planned for a T4 with the Softmax pinned to the GPU: the placed net (copies to and
    from the GPU around the float tail) runs in Caffe2's CPU build with every device
    mapped to the CPU (copies as Copy) and gives what the unplaced net gives."""
    pred, init = _write(tmp_path, resnet_case, "q")
    placed, placed_init = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pbtxt"
    shape = resnet_case["test"][0]["data"].shape
    assert cli.main(["plan", str(pred), "--init-net", str(init), "--input", "data=" + ",".join(map(str, shape)),
                     "--gpu-profile", "t4-pcie3", "--pin", "softmax=cuda:0", "-o", str(placed),
                     "--init-out", str(placed_init)]) == 0
    capsys.readouterr()
    p, i = pb.NetDef(), pb.NetDef()
    text_format.Parse(placed.read_text(), p)
    text_format.Parse(placed_init.read_text(), i)
    assert {"CopyCPUToGPU", "CopyGPUToCPU"} <= set(_types(p))
    nets = {"plain": (resnet_case["p8"], resnet_case["i8"]), "placed": (on_the_cpu(p), on_the_cpu(i))}
    floats = {k: ["pred_float", "softmax"] for k in nets}
    int8s = {k: ["pred", "pool5"] for k in nets}
    want, quant = _caffe2(nets, resnet_case["test"], floats, int8s)
    for key in list(want):
        if key.startswith("plain/"):
            np.testing.assert_array_equal(want["placed/" + key[6:]], want[key], err_msg=key)
    assert {k[6:]: v for k, v in quant.items() if k.startswith("plain/")} == \
        {k[7:]: v for k, v in quant.items() if k.startswith("placed/")}
    # and placer's emulated-GPU run of the placed net gives the same softmax
    ours = Executor(net_from_netdef(p, i), emulate_gpu=True).run(resnet_case["test"][0], warmup=0)
    np.testing.assert_allclose(ours["softmax"], want["plain/0/softmax"], rtol=0, atol=4 * np.finfo(np.float32).eps)


# ---------------------------------------------------------------- the ops' scale limits

def _branchy_net(rng):
    """data -> two convs -> Sum -> global AveragePool -> FC: every constrained op kind."""
    predict, init = pb.NetDef(name="limits"), pb.NetDef(name="limits_init")

    def param(name, arr):
        op = init.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=list(arr.shape))
        op.arg.add(name="values", floats=arr.astype(np.float32).ravel().tolist())
        predict.external_input.append(name)

    def op(t, ins, outs, **args):
        o = predict.op.add(type=t, input=ins, output=outs)
        for k, v in args.items():
            o.arg.add(name=k, i=v)
    param("a_w", rng.uniform(-3, 3, (4, 3, 3, 3)))
    param("a_b", rng.uniform(-1, 1, (4,)))
    param("b_w", rng.uniform(-3, 3, (4, 3, 1, 1)))
    param("fc_w", rng.uniform(-3, 3, (5, 4)))
    param("fc_b", rng.uniform(-1, 1, (5,)))
    predict.external_input.insert(0, "data")
    op("Conv", ["data", "a_w", "a_b"], ["a"], kernel=3, pad=1)
    op("Conv", ["data", "b_w"], ["b"], kernel=1)
    op("Sum", ["a", "b"], ["s"])
    op("AveragePool", ["s"], ["p"], global_pooling=1)
    op("FC", ["p", "fc_w", "fc_b"], ["y"])
    predict.external_output.append("y")
    return predict, init


@pytest.mark.caffe2
def test_scales_are_raised_to_the_ops_limits_and_run_in_caffe2():
    """Calibration ranges far narrower than the inputs' (as a conv whose output cancels out
    gives) would break QNNPACK's limits: x_scale * w_scale / y_scale < 1 (conv, FC), input /
    output scale ratios below 2^8 (Int8Sum, Int8AveragePool). quantize raises the output
    scales until they hold; placer and Caffe2 then run the net (both refuse a net that
    breaks them) to the same bytes."""
    rng = np.random.default_rng(21)
    predict, init = _branchy_net(rng)
    net = qz.prepare(predict, init)
    batches = _batches(rng, (2, 3, 6, 6), 2)
    ranges, shapes_ = qz.activation_ranges(net, batches)
    factor = {"a": 1e-6, "s": 1e-6, "p": 1e-6, "y": 1e-10}
    narrow = {k: (lo * factor.get(k, 1.0), hi * factor.get(k, 1.0)) for k, (lo, hi) in ranges.items()}
    p8, i8 = qz.convert(net, narrow, shapes_)
    plain = {k: qz.qparams(*v) for k, v in narrow.items()}
    got = {op.output[0]: {a.name: (a.f if a.name == "Y_scale" else a.i) for a in op.arg}
           for op in list(p8.op) + list(i8.op)}
    x_s, a_s, b_s = got["data_int8"]["Y_scale"], got["a"]["Y_scale"], got["b"]["Y_scale"]
    s_s, p_s, y_s = got["s"]["Y_scale"], got["p"]["Y_scale"], got["y_int8"]["Y_scale"]
    for name, scale in (("a", a_s), ("s", s_s), ("p", p_s), ("y", y_s)):
        assert scale > plain[name].scale, name                      # raised
    f = np.float32
    assert f(x_s) * f(got["a_w"]["Y_scale"]) / f(a_s) < 1
    assert f(p_s) * f(got["fc_w"]["Y_scale"]) / f(y_s) < 1
    assert max(f(a_s), f(b_s)) / f(s_s) < 2 ** 8 and f(s_s) / f(p_s) < 2 ** 8
    ours = _ours(p8, i8, batches[0], _int8_blobs(p8))
    want, quant = _caffe2({"int8": (p8, i8)}, batches[:1], {"int8": ["y"]}, {"int8": _int8_blobs(p8)})
    for name in _int8_blobs(p8):
        np.testing.assert_array_equal(ours[name].data, want[f"int8/0/{name}"], err_msg=name)
    np.testing.assert_array_equal(ours["y"], want["int8/0/y"])


# ---------------------------------------------------------------- the bundled Int8 example

@pytest.mark.caffe2
def test_the_bundled_int8_example_loads_regenerates_and_runs_as_in_caffe2():
    path = examples.path("resnet_tiny_int8")
    net = load_net(path)                                      # the init net found beside it
    assert net.init_proto is not None and net.input_shapes["data"] == TensorType((1, 3, 32, 32))
    fresh = examples.builders()["resnet_tiny_int8"]()
    assert text_format.MessageToString(fresh.predict) == path.read_text()
    assert text_format.MessageToString(fresh.init) == (examples.DATA / "resnet_tiny_int8_init.pbtxt").read_text()
    batch = _batches(np.random.default_rng(5), (1, 3, 32, 32), 1)
    int8s = _int8_blobs(net.proto)
    want, _ = _caffe2({"n": (net.proto, net.init_proto)}, batch, {"n": ["pred_float", "softmax"]},
                      {"n": int8s})
    ours = _ours(net.proto, net.init_proto, batch[0], int8s + ["pred_float"])
    for name in int8s:
        np.testing.assert_array_equal(ours[name].data, want[f"n/0/{name}"], err_msg=name)
    np.testing.assert_array_equal(ours["pred_float"], want["n/0/pred_float"])
    assert len(np.unique(ours["pred"].data)) > 3


# ---------------------------------------------------------------- the other converted ops

def _mixed_net(rng):
    """Conv -> MaxPool -> Relu (a standalone Int8Relu) -> Flatten of a 3 x 3 map (an
    Int8Transpose back to NCHW order first) -> FC -> Relu; a Reshape of the same map -> FC;
    a 2-D Concat of the two; FC -> Softmax."""
    predict, init = pb.NetDef(name="mixed"), pb.NetDef(name="mixed_init")

    def param(name, shape):
        arr = rng.uniform(-1, 1, shape)
        op = init.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=list(arr.shape))
        op.arg.add(name="values", floats=arr.astype(np.float32).ravel().tolist())
        predict.external_input.append(name)

    def op(t, ins, outs, **args):
        o = predict.op.add(type=t, input=ins, output=outs)
        for k, v in args.items():
            if isinstance(v, list):
                o.arg.add(name=k, ints=v)
            else:
                o.arg.add(name=k, i=v)
    predict.external_input.append("data")
    for name, shape in (("c_w", (6, 2, 3, 3)), ("c_b", (6,)), ("f1_w", (7, 54)), ("f1_b", (7,)),
                        ("f2_w", (5, 54)), ("f2_b", (5,)), ("f3_w", (4, 12)), ("f3_b", (4,))):
        param(name, shape)
    op("Conv", ["data", "c_w", "c_b"], ["c"], kernel=3, pad=1)
    op("MaxPool", ["c"], ["m"], kernel=2, stride=2)
    op("Relu", ["m"], ["m"])
    op("Flatten", ["m"], ["flat"])
    op("FC", ["flat", "f1_w", "f1_b"], ["f1"])
    op("Relu", ["f1"], ["f1"])
    op("Reshape", ["m"], ["r", "r_old_shape"], shape=[0, -1])
    op("FC", ["r", "f2_w", "f2_b"], ["f2"])
    op("Concat", ["f1", "f2"], ["cat", "cat_dims"], axis=1)
    op("FC", ["cat", "f3_w", "f3_b"], ["logits"])
    op("Softmax", ["logits"], ["prob"])
    predict.external_output.extend(["prob", "flat"])
    return predict, init


@pytest.mark.caffe2
@pytest.mark.parametrize("int8_softmax", [False, True], ids=["float-softmax", "int8-softmax"])
def test_flatten_reshape_concat_relu_and_softmax_convert_and_match_caffe2(int8_softmax):
    rng = np.random.default_rng(31)
    predict, init = _mixed_net(rng)
    batches = _batches(rng, (3, 2, 6, 6), 3)
    calibration = _batches(np.random.default_rng(5), (3, 2, 6, 6), 16)
    p8, i8 = qz.quantize(predict, init, calibration, int8_softmax=int8_softmax)
    types = _types(p8)
    assert {"Int8Transpose", "Int8Flatten", "Int8Reshape", "Int8Concat", "Int8Relu"} <= set(types)
    assert ("Int8Softmax" in types) == int8_softmax and ("Softmax" in types) != int8_softmax
    assert types.count("Int8Transpose") == 1                # one NCHW copy for Flatten and Reshape
    int8s = _int8_blobs(p8)
    want, quant = _caffe2({"q": (p8, i8)}, batches[2:], {"q": ["prob", "flat"]}, {"q": int8s})
    ours = _ours(p8, i8, batches[2], int8s)
    for name in int8s:
        np.testing.assert_array_equal(ours[name].data, want[f"q/0/{name}"], err_msg=name)
        assert (ours[name].scale, ours[name].zero_point) == (float(np.float32(quant[f"q/0/{name}"][0])),
                                                             quant[f"q/0/{name}"][1])
    np.testing.assert_array_equal(ours["flat"], want["q/0/flat"])      # dequantized: exact
    # the flattened map keeps the float net's (C, H, W) order: on average within a step of
    # the float values (input, weight and output rounding of the conv before it), where the
    # same values in (H, W, C) order are several steps away
    flat_scale = ours["flat_int8"].scale
    ref = qz.run_float(qz.prepare(predict, init), batches[2])
    assert np.abs(ours["flat"] - ref["flat"]).mean() <= flat_scale
    hwc = ref["m"].transpose(0, 2, 3, 1).reshape(ref["flat"].shape)
    assert np.abs(ours["flat"] - hwc).mean() >= 5 * flat_scale
    if int8_softmax:
        np.testing.assert_array_equal(ours["prob"], want["q/0/prob"])
    else:
        np.testing.assert_allclose(ours["prob"], want["q/0/prob"], rtol=0, atol=4 * np.finfo(np.float32).eps)
    # the logits: where not saturated, on average within a step of their scale of the
    # float net's (four roundings before them, each within half a step of its own scale);
    # where saturated, the float value is indeed past the representable range
    lg = ours["logits"]
    logits = (lg.data.astype(np.float64) - lg.zero_point) * lg.scale
    inside = (lg.data > 0) & (lg.data < 255)
    assert inside.mean() >= 0.75
    assert np.abs(logits - ref["logits"])[inside].mean() <= lg.scale
    assert np.all(np.where(lg.data == 0, ref["logits"] <= logits + lg.scale / 2, True))
    assert np.all(np.where(lg.data == 255, ref["logits"] >= logits - lg.scale / 2, True))
    assert np.sum(ours["prob"].argmax(1) == ref["prob"].argmax(1)) >= 2


@pytest.mark.caffe2
@pytest.mark.slow
def test_corpus_resnet50_int8_at_224_matches_caffe2_and_the_float_net():
    """The Caffe ResNet-50 deploy net (53 convs with BatchNorm + Scale folded, 16 residual
    Int8SumRelu) at 1x3x224x224, its BN variances drawn: placer's Int8 logits equal
    Caffe2's bit for bit, and follow the float net's."""
    net = load_net(corpus_dir() / "caffe" / "resnet50_ResNet-50-deploy.prototxt",
                   input_shapes={"data": TensorType((1, 3, 224, 224))})
    rng = np.random.default_rng(17)
    params = {k: np.asarray(v) for k, v in Executor(net).run_init().items()}
    params = {k: (rng.uniform(0.5, 1.5, v.shape).astype(np.float32) if "bn" in k and k.endswith("_riv")
                  else v) for k, v in params.items()}
    calibration = _batches(rng, (1, 3, 224, 224), 2)
    p8, i8 = qz.quantize(net.proto, net.init_proto, calibration, params=params)
    types = _types(p8)
    assert types.count("Int8SumRelu") == 16 and "SpatialBN" not in types
    assert types.count("Int8Conv") + types.count("Int8ConvRelu") == 53
    logits = next(op.input[0] for op in net.proto.op if op.type == "Softmax")
    test = _batches(rng, (1, 3, 224, 224), 1)
    want, quant = _caffe2({"q": (p8, i8)}, test, {"q": [f"{logits}_float"]}, {"q": [logits, "pool5"]})
    ours = _ours(p8, i8, test[0], [logits, "pool5", f"{logits}_float"])
    for name in (logits, "pool5"):
        np.testing.assert_array_equal(ours[name].data, want[f"q/0/{name}"], err_msg=name)
    np.testing.assert_array_equal(ours[f"{logits}_float"], want[f"q/0/{logits}_float"])
    ref = qz.run_float(qz.prepare(net.proto, net.init_proto, params), test[0])[logits]
    # the 1000 logits on average within a step of their scale (measured: 0.5, the worst
    # 2.4 steps over 4 images), correlated above 0.999 less their mean, the same top class
    q = ours[f"{logits}_float"]
    scale = ours[logits].scale
    assert np.abs(q - ref).mean() <= scale
    centred = np.corrcoef((ref - ref.mean()).ravel(), (q - ref.mean()).ravel())[0, 1]
    assert centred >= 0.999, centred
    assert q.argmax() == ref.argmax()


def _tiny(ops, params=(("w", (4, 3, 3, 3)), ("b", (4,)))):
    """A net on data (2, 3, 6, 6) with ``ops``: (type, inputs, outputs, args)."""
    rng = np.random.default_rng(3)
    predict, init = pb.NetDef(name="bad"), pb.NetDef(name="bad_init")
    predict.external_input.append("data")
    for name, shape in params:
        op = init.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=list(shape))
        op.arg.add(name="values", floats=rng.uniform(-1, 1, shape).astype(np.float32).ravel().tolist())
        predict.external_input.append(name)
    for t, ins, outs, args in ops:
        o = predict.op.add(type=t, input=ins, output=outs)
        for k, v in args.items():
            if isinstance(v, str):
                o.arg.add(name=k, s=v.encode())
            else:
                o.arg.add(name=k, i=v)
    predict.external_output.append(ops[-1][2][0])
    return predict, init


CONV = ("Conv", ["data", "w", "b"], ["c"], {"kernel": 3, "pad": 1})
BAD_NETS = {
    "sigmoid": ([CONV, ("Sigmoid", ["c"], ["y"], {})], r"#1 Sigmoid -> 'y': Sigmoid has no Int8 form"),
    "sum-of-three": ([CONV, ("Sum", ["c", "c", "c"], ["y"], {})], r"#1 Sum .*exactly two inputs, found 3"),
    "reduce-mean": ([CONV, ("ReduceMean", ["c"], ["m"], {"keepdims": 1})], r"#1 ReduceMean .*no Int8 form"),
    "broadcast-add": ([CONV, ("AveragePool", ["c"], ["m"], {"global_pooling": 1}), ("Add", ["c", "m"], ["y"], {})],
                      r"#2 Add .*does not broadcast"),
    "fc-axis-2": ([CONV, ("FC", ["c", "w", "b"], ["y"], {"axis": 2})], r"#1 FC .*axis 1"),
    "bn-not-after-conv": ([CONV, ("Relu", ["c"], ["r"], {}),
                           ("SpatialBN", ["r", "b", "b", "b", "b"], ["y"], {"is_test": 1})],
                          r"#2 SpatialBN .*folded into a Conv"),
    "after-the-float-tail": ([CONV, ("Softmax", ["c"], ["s"], {}), ("Relu", ["s"], ["y"], {})],
                             r"#2 Relu .*float output of the float tail \('s'\)"),
    "nhwc-conv": ([("Conv", ["data", "w", "b"], ["y"], {"kernel": 3, "order": "NHWC"})],
                  r"#0 Conv .*NCHW float nets"),
    "control": ([("Conv", ["data", "w", "b"], ["y"], {"kernel": 3})], None),
}


@pytest.mark.parametrize("case", sorted(BAD_NETS))
def test_nets_that_cannot_be_quantized_say_which_op_in_one_line(case):
    ops, message = BAD_NETS[case]
    predict, init = _tiny(ops)
    batches = _batches(np.random.default_rng(0), (2, 3, 6, 6), 1)
    if message is None:                       # the control: the same conv alone converts
        p8, _ = qz.quantize(predict, init, batches)
        assert "Int8Conv" in _types(p8)
        return
    with pytest.raises(ArgumentError, match=message) as e:
        qz.quantize(predict, init, batches)
    assert "\n" not in str(e.value)
