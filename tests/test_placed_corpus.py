"""Placed nets run like the originals: every runnable corpus net and the bundled examples.

Each net is planned by ``placer plan -o placed.pbtxt --init-out placed_init.pbtxt``, then
the placed net runs under the emulated GPU (an op handed a blob on the wrong device
fails) and its outputs are compared with the original net run on the CPU, same inputs,
same seed. CPU-vs-GPU costs put most nets wholly on the GPU, so every net is planned a
second time with ``--pin`` forcing a mixed placement with copies in both directions.
Batch 1 throughout, to keep the CPU runs short.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_dir, corpus_files
from test_plan_cli import assert_consistent, strict_json

from placer import cli, examples
from placer.commands.common import parse_input_specs
from placer.formats import caffe2_pb as pb
from placer.formats import load_net
from placer.formats.caffe2 import load_netdef
from placer.runtime.executor import Executor
from placer.runtime.inputs import random_inputs
from placer.shapes import infer

pytestmark = [pytest.mark.corpus, pytest.mark.slow]

# id: (file: "caffe/..", "caffe2/.." in the corpus or "example:NAME", init net, --input, mixed pins)
# (batch-1 LeNet and CIFAR-10 plan all on the CPU once GPU ops pay per kernel launch: a
# GPU pin keeps their mixed placement mixed)
CASES = {
    "lenet": ("caffe/mnist_lenet.prototxt", None, ["data=1,1,28,28"], ["Relu=cpu", "Conv=gpu"]),
    "lenet_train_test": ("caffe/mnist_lenet_train_test.prototxt", None,
                         ["data=1,1,28,28", "label=1:int32"], ["Relu=cpu", "Conv=gpu"]),
    "v1_lenet_train_test": ("caffe/v1_mnist_lenet_train_test.prototxt", None,
                            ["data=1,1,28,28", "label=1:int32"], ["Relu=cpu", "Conv=gpu"]),
    "cifar10_bn": ("caffe/cifar10_full_sigmoid_train_test_bn.prototxt", None,
                   ["data=1,3,32,32", "label=1:int32"], ["Sigmoid=cpu", "Conv=gpu"]),
    "alexnet": ("caffe/bvlc_alexnet_deploy.prototxt", None, ["data=1,3,227,227"], ["Relu=cpu"]),
    "alexnet_train_val": ("caffe/bvlc_alexnet_train_val.prototxt", None,
                          ["data=1,3,227,227", "label=1:int32"], ["Relu=cpu"]),
    "caffenet": ("caffe/caffenet_deploy.prototxt", None, ["data=1,3,227,227"], ["Relu=cpu"]),
    "v1_caffenet": ("caffe/v1_caffenet_deploy.prototxt", None, ["data=1,3,227,227"], ["Relu=cpu"]),
    "squeezenet": ("caffe/squeezenet_v1.0_deploy.prototxt", None, ["data=1,3,227,227"], ["Relu=cpu"]),
    "mobilenet": ("caffe/mobilenet_deploy.prototxt", None, ["data=1,3,224,224"], ["Relu=cpu"]),
    "googlenet_train_val": ("caffe/bvlc_googlenet_train_val.prototxt", None,
                            ["data=1,3,224,224", "label=1:int32"], ["Relu=cpu"]),
    "resnet50": ("caffe/resnet50_ResNet-50-deploy.prototxt", None, ["data=1,3,224,224"], ["Relu=cpu"]),
    "glow_sls_fused8bit": ("caffe2/glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt",
                           "caffe2/glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt",
                           ["indices=8:int64", "lengths=3:int32"], None),
    "glow_gather_const_fold": ("caffe2/glow_gather_const_fold.pbtxt", "caffe2/glow_gather_const_fold_init.pbtxt",
                               ["data=2,3,4,5", "result=2,4,5,3"], ["Gather=gpu"]),
    "glow_pre_partitioned": ("caffe2/glow_pre_partitioned_multi_op_predict_net.pbtxt", None,
                             ["mm0_in=8,8", "mm1_in=8,8", "add_in=8,8"], ["MatMul=gpu", "Add=cpu"]),
    "dlrm_small": ("example:dlrm_small", "example:dlrm_small_init", [], ["Relu=cpu"]),
    "resnet_small": ("example:resnet_small", "example:resnet_small_init", [], ["Relu=cpu"]),
}
# Not runnable, so only planned in test_every_corpus_net_plans_or_says_what_is_missing:
# Caffe2 predict nets whose parameters come from an init net the corpus does not hold, and
# nets with op types placer has no entry for (crayon's stylizer ops).
UNMIXABLE = {"glow_sls_fused8bit": "its one op (SparseLengthsSumFused8BitRowwise) has no GPU kernel"}


def resolve(spec: str | None) -> Path | None:
    if spec is None:
        return None
    if spec.startswith("example:"):
        return examples.DATA / f"{spec.split(':', 1)[1]}.pbtxt"
    return corpus_dir() / spec


def plan(*argv) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plan", *map(str, argv), "--json"])
    assert rc == 0, err.getvalue()
    return strict_json(out.getvalue())


def check_placed_file(original, placed_path: Path, doc: dict, source: Path) -> None:
    """Same ops in the same order with a device_option each; copies named as documented;
    for a Caffe2 source, nothing outside the ops changed but parameter copies' inputs."""
    placed = load_netdef(placed_path)
    users = [op for op in placed.op if not op.type.startswith("Copy")]
    assert [op.type for op in users] == [op.type for op in original.ops]
    for op, o in zip(users, doc["ops"]):
        assert op.HasField("device_option")
        assert op.device_option.device_type == (1 if o["device"] == "gpu" else 0)
    copies = [op for op in placed.op if op.type.startswith("Copy")]
    assert len(copies) == len(doc["copies"])
    outputs = set(original.external_outputs)
    for op in copies:
        assert op.type in ("CopyCPUToGPU", "CopyGPUToCPU") and op.device_option.device_type == 1
        src, dst = op.input[0], op.output[0]
        if op.type == "CopyCPUToGPU":
            assert re.fullmatch(re.escape(src) + r"_gpu0(_\d+)?", dst), (src, dst)
        elif dst in outputs:
            assert re.fullmatch(re.escape(dst) + r"_gpu0(_\d+)?", src), (src, dst)
        else:
            assert re.fullmatch(re.escape(src) + r"_cpu(_\d+)?", dst), (src, dst)
    if original.source_format.startswith("caffe2"):
        for was, now in zip(load_netdef(source).op, users):    # only names and devices changed
            assert _without_placement(was) == _without_placement(now)
        a, b = load_netdef(source), pb.NetDef()
        b.CopyFrom(placed)
        del a.op[:], b.op[:]
        extra = [x for x in b.external_input if x not in a.external_input]
        assert all(x.removesuffix("_gpu0") in original.params for x in extra)
        del b.external_input[:]
        b.external_input.extend(x for x in placed.external_input if x not in extra)
        assert a == b


def _without_placement(op: pb.OperatorDef) -> pb.OperatorDef:
    out = pb.OperatorDef()
    out.CopyFrom(op)
    del out.input[:], out.output[:]
    out.device_option.ClearField("device_type")
    out.device_option.ClearField("device_id")
    if not out.device_option.ListFields():
        out.ClearField("device_option")
    return out


def assert_same_outputs(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_allclose(np.asarray(got[k]), ref[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert any(np.any(np.asarray(v) != 0) for v in ref.values())   # not a vacuous comparison


_REFERENCE: dict = {}


def reference(case: str):
    """(net, inputs, outputs of the original on the CPU), once per net."""
    if case not in _REFERENCE:
        file, init, inputs, _ = CASES[case]
        shapes = parse_input_specs(inputs)
        net = load_net(resolve(file), init_path=resolve(init), input_shapes=shapes)
        typed = infer(net, shapes)
        ex = Executor(net)
        ex.run_init()
        feed = random_inputs(net, typed.blobs, ex.expected_inputs(), seed=0)
        _REFERENCE[case] = (net, feed, ex.run(feed))
    return _REFERENCE[case]


@pytest.mark.parametrize("variant", ["plan", "mixed"])
@pytest.mark.parametrize("case", list(CASES))
def test_placed_net_runs_like_the_original(case, variant, tmp_path):
    file, init, inputs, pins = CASES[case]
    if variant == "mixed" and pins is None:
        pytest.skip(f"no mixed placement of {case}: {UNMIXABLE[case]}")
    path, init_path = resolve(file), resolve(init)
    net, feed, ref = reference(case)
    argv = [path, *(["--init-net", init_path] if init_path else []), *[a for s in inputs for a in ("--input", s)]]
    if variant == "mixed":
        argv += [a for p in pins for a in ("--pin", p)]
    has_init = net.init_proto is not None          # Caffe nets get one from the converter
    out, out_init = tmp_path / "placed.pbtxt", (tmp_path / "placed_init.pbtxt" if has_init else None)
    doc = plan(*argv, "-o", out, *(["--init-out", out_init] if has_init else []))
    assert_consistent(doc)
    check_placed_file(net, out, doc, path)
    if variant == "mixed":
        assert {c["direction"] for c in doc["copies"]} == {"h2d", "d2h"}, doc["copies"]
        assert {o["device"] for o in doc["ops"]} == {"cpu", "gpu"}
    placed = load_net(out, init_path=out_init)
    got = Executor(placed, emulate_gpu=True).run(feed)
    assert_same_outputs(got, ref)


@pytest.mark.parametrize("file", [f"{d}/{p.name}" for d in ("caffe", "caffe2")
                                  for p in corpus_files(d, ".prototxt", ".pbtxt", ".pb")])
def test_every_corpus_net_plans_or_says_what_is_missing(file, capsys):
    """Planned with no options: a plan, or one line on stderr saying what to add."""
    path = corpus_dir() / file
    capsys.readouterr()
    rc = cli.main(["plan", str(path), "--json"])
    out, err = capsys.readouterr()
    if rc == 0:
        assert_consistent(strict_json(out))
        return
    assert rc == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("placer: error: "), err
    assert re.search(r"give (--init-net INIT or )?--input NAME=|the net has no ops", line), line


@pytest.mark.parametrize("case", ["googlenet_train_val", "resnet50", "squeezenet", "mobilenet", "dlrm_small"])
def test_makespan_plan_is_never_worse_than_the_mincut_plan(case):
    file, init, inputs, pins = CASES[case]
    argv = [resolve(file), *(["--init-net", resolve(init)] if init else []),
            *[a for s in inputs for a in ("--input", s)]]
    for extra in ([], [a for p in pins for a in ("--pin", p)]):
        mincut, span = plan(*argv, *extra), plan(*argv, *extra, "--method", "makespan")
        assert_consistent(span)
        got, ref = (d["schedules"]["makespan"]["makespan_s"] for d in (span, mincut))
        assert got <= ref * (1 + 1e-9), (case, extra)


def test_dlrm_small_within_a_small_gpu_runs_like_the_original(tmp_path):
    """A GPU too small for every table: some SparseLengthsSum ops stay on the CPU, their
    pooled rows are copied up; the placed net still computes the same click probabilities."""
    file, init, _, _ = CASES["dlrm_small"]
    net, feed, ref = reference("dlrm_small")
    out, out_init = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pbtxt"
    doc = plan(resolve(file), "--init-net", resolve(init), "--gpu-mem", "100MB", "--gpu-reserve", "0",
               "-o", out, "--init-out", out_init)
    assert_consistent(doc)
    sls = [o for o in doc["ops"] if o["type"] == "SparseLengthsSum"]
    assert {o["device"] for o in sls} == {"cpu", "gpu"}
    assert any("fit" in o["reason"] for o in sls if o["device"] == "cpu")
    assert doc["gpu_memory"]["used_bytes"] <= 100e6
    check_placed_file(net, out, doc, resolve(file))
    got = Executor(load_net(out, init_path=out_init), emulate_gpu=True).run(feed)
    assert_same_outputs(got, ref)
