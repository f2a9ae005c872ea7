"""A net runs at the batch of the arrays it is fed, as Caffe and Caffe2 do.

The shapes a net declares (``value_info.json`` beside a Caffe2 net, written by
``placer convert`` from the prototxt's input shape) are defaults: ``placer run --inputs``
infers every blob again from the fed arrays (batch, and spatial size where the net
allows), noting the change on stderr, and ``plan`` / ``profile`` take ``--input`` or
``--inputs`` over the file. Only shapes the weights contradict are refused, in one line.

The corpus part converts LeNet (deploy and train_test), AlexNet and SqueezeNet with
``placer convert``, runs each with ``placer run`` at batch 1, 2 and 4, and compares with
real Caffe2 fed the same inputs and the same weights (one Caffe2 process for all of them).
The other deploy nets of the corpus (CaffeNet, MobileNet, ResNet-50, SSD) are left out to
keep the suite fast: CaffeNet is AlexNet's layers again, ResNet-50 and SSD take seconds
per batch on a CPU.
"""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from conftest import corpus_dir

from placer import cli
from placer.examples.builder import NetBuilder

DECLARED = (8, 3, 6, 6)  # the small net's value_info.json
FILTERS, CLASSES = 4, 5
# placer's float32 against float64: rounding errors of random sign grow as sqrt(K) u S over
# K terms whose magnitudes sum to S (u = 2^-24); a convolution output (K = 27, S under 25
# here) is off by about 8e-6, the spatial mean averages that down, and FC multiplies it by
# the sum of a row's |weights| (under 6): about 5e-5 on outputs of order 5 (measured: 8e-7),
# where a wrong row or a wrong spatial size is off by order 1
TOL = 5e-5


def main(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def small_net(folder):
    """Conv 3x3 (3 -> 4 channels) -> Relu -> global AveragePool -> FC (4 -> 5), weights
    given, declared at 8x3x6x6: any batch and any spatial size from 3x3 up can run."""
    rng = np.random.default_rng(5)
    weights = {"conv_w": rng.standard_normal((FILTERS, 3, 3, 3)), "conv_b": rng.standard_normal(FILTERS),
               "fc_w": rng.standard_normal((CLASSES, FILTERS)), "fc_b": rng.standard_normal(CLASSES)}
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    b = NetBuilder("small")
    b.input("data", DECLARED)
    for name, value in weights.items():
        b.param(name, value.shape, fill="GivenTensorFill", values=[float(x) for x in value.ravel()])
    b.op("Conv", ["data", "conv_w", "conv_b"], "conv", kernel=3)
    b.op("Relu", ["conv"], "conv")
    b.op("AveragePool", ["conv"], "pool", global_pooling=1)
    b.op("FC", ["pool", "fc_w", "fc_b"], "fc")
    b.output("fc")
    paths = b.save(folder, "small")
    return paths["predict"], weights


def reference(x: np.ndarray, w: dict) -> np.ndarray:
    """The small net in float64 numpy: valid 3x3 convolution, Relu, mean over space, FC."""
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
    conv = np.einsum("ncijkl,fckl->nfij", windows, w["conv_w"]) + w["conv_b"][None, :, None, None]
    pooled = np.maximum(conv, 0).mean(axis=(2, 3))
    return pooled @ w["fc_w"].T + w["fc_b"]


@pytest.mark.parametrize("shape", [(2, 3, 6, 6), (1, 3, 9, 7)], ids=["batch 2", "batch 1 at 9x7"])
def test_run_infers_the_net_at_the_fed_shape(tmp_path, shape):
    net, weights = small_net(tmp_path)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.savez(tmp_path / "x.npz", data=x)
    code, _, err = main("run", net, "--inputs", tmp_path / "x.npz", "--outputs", tmp_path / "y.npz")
    assert code == 0, err
    dims = "x".join(map(str, shape))
    assert err.count("\n") == 1 and f"note: 'data' {dims} from {tmp_path / 'x.npz'}" in err
    assert f"small.value_info.json declares {'x'.join(map(str, DECLARED))}" in err
    with np.load(tmp_path / "y.npz") as y:
        got = y["fc"]
    np.testing.assert_allclose(got, reference(x, weights), rtol=0, atol=TOL)
    assert got.shape == (shape[0], CLASSES)


@pytest.mark.parametrize("shape, quiet", [(DECLARED, []), ((2, 3, 6, 6), ["--quiet"])],
                         ids=["declared", "quiet"])
def test_no_note_at_the_declared_shape_or_with_quiet(tmp_path, shape, quiet):
    net, _ = small_net(tmp_path)
    np.savez(tmp_path / "x.npz", data=np.ones(shape, np.float32))
    code, _, err = main("run", net, "--inputs", tmp_path / "x.npz", *quiet)
    assert code == 0 and err == ""


@pytest.mark.parametrize("shape, words", [
    ((2, 4, 6, 6), "op #0 Conv -> 'conv': filter W 4x3x3x3 has 3 channels per group but X 2x4x6x6"),
    ((2, 6, 6), "op #0 Conv -> 'conv': input X must be 4-D"),
], ids=["channels", "rank"])
def test_a_shape_the_weights_contradict_is_refused_in_one_line(tmp_path, monkeypatch, shape, words):
    net, _ = small_net(tmp_path)
    np.savez(tmp_path / "x.npz", data=np.ones(shape, np.float32))
    monkeypatch.chdir(tmp_path)   # the paths a user types (an error line stays under 300 characters)
    code, out, err = main("run", net.name, "--inputs", "x.npz", "--quiet")
    dims = "x".join(map(str, shape))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err and len(err) < 300
    assert err.startswith(f"placer: error: 'data' {dims} from x.npz ")
    assert "declares 8x3x6x6" in err and words in err


def test_arrays_the_net_does_not_read_are_ignored(tmp_path):
    net, weights = small_net(tmp_path)
    x = np.random.default_rng(1).standard_normal((3, 3, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "x.npz", data=x, unused=np.ones((7, 7), np.float32))
    code, _, err = main("run", net, "--inputs", tmp_path / "x.npz", "--outputs", tmp_path / "y.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_allclose(y["fc"], reference(x, weights), rtol=0, atol=TOL)


def test_an_input_option_that_contradicts_the_fed_arrays_is_refused(tmp_path):
    net, _ = small_net(tmp_path)
    np.savez(tmp_path / "x.npz", data=np.ones((2, 3, 6, 6), np.float32))
    code, _, err = main("run", net, "--inputs", tmp_path / "x.npz", "--input", "data=4,3,6,6", "--quiet")
    assert code == 2 and "'data' has shape (2, 3, 6, 6), expected (4, 3, 6, 6)" in err


@pytest.mark.parametrize("given", ["--input", "--inputs"])
def test_plan_at_another_batch_than_value_info_gives_that_batch(tmp_path, given):
    """Every tensor of the plan at batch 2, not 8: bytes, FLOPs, the placed net's value_info."""
    net, _ = small_net(tmp_path)
    np.savez(tmp_path / "x.npz", data=np.ones((2, 3, 6, 6), np.float32))
    arg = "data=2,3,6,6" if given == "--input" else tmp_path / "x.npz"
    code, out, err = main("plan", net, given, arg, "--json", "-o", tmp_path / "placed.pbtxt")
    assert code == 0, err
    assert "note: 'data' 2x3x6x6 from" in err and "declares 8x3x6x6" in err
    doc = json.loads(out)
    nbytes = {t["name"]: t["bytes"] for t in doc["tensors"]}
    assert nbytes["data"] == 2 * 3 * 6 * 6 * 4
    assert nbytes["conv"] == 2 * FILTERS * 4 * 4 * 4 and nbytes["fc"] == 2 * CLASSES * 4
    conv = next(o for o in doc["ops"] if o["type"] == "Conv")
    outputs = 2 * FILTERS * 4 * 4
    assert conv["flops"] == outputs * (2 * 3 * 3 * 3 + 1)   # 27 MACs of 2 FLOPs and the bias per output
    placed_info = json.loads((tmp_path / "placed.value_info.json").read_text())
    assert placed_info == {"data": [1, [2, 3, 6, 6]]}


def test_profile_times_the_ops_at_the_batch_of_the_fed_arrays(tmp_path):
    net, _ = small_net(tmp_path)
    np.savez(tmp_path / "x.npz", data=np.ones((2, 3, 6, 6), np.float32))
    code, _, err = main("profile", net, "--inputs", tmp_path / "x.npz", "-o", tmp_path / "p.json")
    assert code == 0, err
    assert f"note: 'data' 2x3x6x6 from {tmp_path / 'x.npz'}" in err
    ops = json.loads((tmp_path / "p.json").read_text())["devices"][0]["ops"]
    timed = {o["type"]: [i["shape"] for i in o["inputs"]] for o in ops}
    assert timed["Conv"] == [[2, 3, 6, 6], [FILTERS, 3, 3, 3], [FILTERS]]
    assert timed["FC"][0] == [2, FILTERS, 1, 1]


# -- the corpus, converted, against real Caffe2 --------------------------------------------

# id: (prototxt under nets/caffe, placer convert --input, the range of the fed pixels: LeNet's
# Data layer scales them to [0, 1); the ImageNet nets are fed mean-subtracted pixels, and
# at that scale SqueezeNet's random weights give distinct classes: on N(0, 1) noise its
# probabilities lie within 2.4% of each other and two samples' within 0.03%)
CORPUS_NETS = {
    "lenet": ("mnist_lenet.prototxt", [], (0, 1)),
    "lenet_train_test": ("mnist_lenet_train_test.prototxt", ["data=64,1,28,28"], (0, 1)),
    "alexnet": ("bvlc_alexnet_deploy.prototxt", [], (-128, 128)),
    "squeezenet": ("squeezenet_v1.0_deploy.prototxt", [], (-128, 128)),
}
BATCHES = (1, 2, 4)

CAFFE2_BATCHES = """
for case in json.loads(cases_json):
    workspace.ResetWorkspace()
    predict = caffe2_pb2.NetDef()
    text_format.Merge(case["predict"], predict)
    for name in case["weights"]:
        workspace.FeedBlob(name, inputs[case["id"] + "/w/" + name])
    for batch in case["batches"]:
        for name in case["feeds"]:
            workspace.FeedBlob(name, inputs["%s/%d/%s" % (case["id"], batch, name)])
        workspace.RunNetOnce(predict)
        for name in predict.external_output:
            save(**{"%s/%d/%s" % (case["id"], batch, name): workspace.FetchBlob(name)})
"""


def _feeds(declared: dict, batch: int, pixels: tuple, rng) -> dict[str, np.ndarray]:
    """Inputs at ``batch``, the rest of each shape as declared: floats uniform in
    ``pixels``, labels valid for 10 classes."""
    out = {}
    for name, t in declared.items():
        shape = (batch, *t.shape[1:])
        out[name] = (rng.integers(0, 10, shape).astype(t.dtype) if np.dtype(t.dtype).kind in "iu"
                     else rng.uniform(*pixels, shape).astype(t.dtype))
    return out


@pytest.fixture(scope="module")
def batch_runs(tmp_path_factory):
    """Per net: placer's outputs at each batch, Caffe2's, and placer run's stderr."""
    from caffe2_oracle import require_caffe2
    from google.protobuf import text_format

    from placer.formats import load_net
    from placer.runtime.executor import Executor
    nets = corpus_dir() / "caffe"
    require_caffe2()
    rng = np.random.default_rng(7)
    cases, arrays, ours, notes = [], {}, {}, {}
    for case, (prototxt, shapes, pixels) in CORPUS_NETS.items():
        out = tmp_path_factory.mktemp(case)
        code, _, err = main("convert", nets / prototxt, "-o", out, *(f"--input={s}" for s in shapes))
        assert code == 0, err
        net = load_net(out / "predict_net.pbtxt")          # finds init_net.pbtxt and value_info.json
        executor = Executor(net)                           # placer run's weights: the same seed (0)
        weights = {k: np.asarray(v) for k, v in executor.run_init().items()}
        arrays.update({f"{case}/w/{k}": v for k, v in weights.items()})
        for batch in BATCHES:
            feed = _feeds(net.input_shapes, batch, pixels, rng)
            np.savez(out / f"x{batch}.npz", **feed)
            code, _, err = main("run", out / "predict_net.pbtxt", "--inputs", out / f"x{batch}.npz",
                                "--outputs", out / f"y{batch}.npz", "--warmup", "0")
            assert code == 0, err
            notes[case, batch] = err
            with np.load(out / f"y{batch}.npz") as y:
                ours.update({f"{case}/{batch}/{k}": y[k] for k in y.files})
            arrays.update({f"{case}/{batch}/{k}": v for k, v in feed.items()})
        cases.append({"id": case, "predict": text_format.MessageToString(net.proto), "weights": sorted(weights),
                      "feeds": sorted(net.input_shapes), "batches": list(BATCHES)})
    from caffe2_oracle import run_caffe2
    theirs, _ = run_caffe2(f"cases_json = {json.dumps(json.dumps(cases))}\n" + CAFFE2_BATCHES, arrays)
    return ours, theirs, notes


@pytest.mark.corpus
@pytest.mark.caffe2
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORPUS_NETS))
def test_converted_corpus_nets_run_at_batch_1_2_and_4_as_caffe2_does(batch_runs, case):
    ours, theirs, notes = batch_runs
    for batch in BATCHES:
        keys = sorted(k for k in theirs if k.startswith(f"{case}/{batch}/"))
        assert keys and keys == sorted(k for k in ours if k.startswith(f"{case}/{batch}/"))
        for k in keys:
            got, want = ours[k], theirs[k]
            assert got.shape == want.shape and (got.ndim == 0 or got.shape[0] == batch), k
            # float32 dot products of up to K = 9216 terms (AlexNet's fc6) summed in another
            # order by another BLAS: under K * 2^-24 = 5.5e-4 of the sum of |terms| even
            # when nothing cancels, about sqrt(K) * 2^-24 = 6e-6 in practice, over at most
            # eight such layers; a softmax turns an absolute logit error into the same
            # relative error of every probability, tiny ones too (AlexNet's logits span
            # about 60 at these inputs: 60 * 1e-6 = 6e-5 expected; measured under 1e-4),
            # so rtol 1e-3 holds at every entry with no absolute slack
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=0, err_msg=k)
        note = notes[case, batch]
        assert note.count("\n") == 1 and f"note: 'data' {batch}x" in note and "value_info.json declares" in note
    for k in (k for k in theirs if k.startswith(f"{case}/4/") and theirs[k].ndim):
        # not a vacuous comparison: no row is uniform, and every sample's row differs from
        # the first by ten times the tolerance somewhere (rows swapped or repeated would fail)
        rows = theirs[k].reshape(4, -1)
        assert (rows.max(axis=1) > 1.5 * rows.min(axis=1)).all(), k
        assert (np.abs(rows[1:] / rows[0] - 1).max(axis=1) > 1e-2).all(), k
