"""``--precision``: the dtype tables of placer.costs.precision, and the precision flowing from
``placer plan`` / ``shard`` / ``report`` into the cost model, the plan JSON and the report.

Every byte figure compared here is exact: halving a float32 tensor's bytes is a division
by two of an integer count of bytes, so the tests compare with ``==``, no tolerance.
"""
from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from test_plan_cli import cli_plan, mixed_net, plan_doc

from placer import cli
from placer.costs import precision as P
from placer.costs.model import CostModel, annotate
from placer.documents.plan import PlanDocument
from placer.errors import InputError
from placer.examples.builder import NetBuilder
from placer.hardware.machine import machine_from_args
from placer.report.doc import read_plan
from placer.shapes import infer
from placer.types import TensorType

QUICK = ("--stability-draws", "0")
PEAKS_FP16 = {"float32": 19.5e12, "float16": 312e12}              # a100-40gb-sxm4.json's keys
PEAKS_ALL = {"float32": 19.5e12, "float16": 312e12, "tf32": 156e12, "bfloat16": 312e12}


# -- the tables ---------------------------------------------------------------------------

def test_check_precision_passes_auto_and_every_name_and_lists_them_otherwise():
    assert P.check_precision(None) is None
    assert [P.check_precision(p) for p in P.PRECISIONS] == list(P.PRECISIONS)
    with pytest.raises(InputError) as e:
        P.check_precision("fp8")
    assert "'fp8'" in str(e.value) and "fp32, tf32, fp16, bf16, amp" in str(e.value)
    with pytest.raises(InputError):
        CostModel(precision="half")
    assert CostModel().precision is None and CostModel(precision="amp").precision == "amp"


@pytest.mark.parametrize("command", [["plan", "net.pbtxt"], ["shard", "--dlrm", "small"], ["report", "plan.json", "-o", "r.html"]])
def test_an_unknown_precision_on_the_command_line_is_one_line_and_exit_2(capsys, command):
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--precision", "fp8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--precision" in err and "fp8" in err
    assert all(p in err for p in P.PRECISIONS)


@pytest.mark.parametrize("precision, dtype, peaks, expected", [
    (None, "float32", PEAKS_ALL, "float32"), (None, "float16", PEAKS_ALL, "float16"),
    ("fp32", "float32", PEAKS_ALL, "float32"),
    ("tf32", "float32", PEAKS_ALL, "tf32"), ("tf32", "float32", PEAKS_FP16, "float32"),
    ("fp16", "float32", PEAKS_FP16, "float16"), ("amp", "float32", PEAKS_FP16, "float16"),
    ("bf16", "float32", PEAKS_ALL, "bfloat16"), ("bf16", "float32", PEAKS_FP16, "float16"),
    ("bf16", "float32", {"float32": 1e12}, "float32"),
    # only float32 tensors are re-typed
    ("fp16", "float16", PEAKS_FP16, "float16"), ("fp32", "float16", PEAKS_FP16, "float16"),
    ("amp", "int8", PEAKS_FP16, "int8"), ("tf32", "int32", PEAKS_ALL, "int32"),
])
def test_gemm_dtype(precision, dtype, peaks, expected):
    assert P.gemm_dtype(precision, dtype, peaks) == expected


@pytest.mark.parametrize("precision, dtype, is_param, keeps, stored, scale", [
    (None, "float32", False, False, "float32", 1.0), ("fp32", "float32", True, False, "float32", 1.0),
    ("tf32", "float32", False, False, "float32", 1.0),
    ("fp16", "float32", False, False, "float16", 0.5), ("fp16", "float32", True, False, "float16", 0.5),
    ("fp16", "float32", False, True, "float16", 0.5),
    ("bf16", "float32", True, False, "bfloat16", 0.5),
    ("amp", "float32", False, False, "float16", 0.5), ("amp", "float32", True, False, "float32", 1.0),
    ("amp", "float32", False, True, "float32", 1.0),
    ("fp16", "int32", False, False, "int32", 1.0), ("amp", "float16", False, False, "float16", 1.0),
    ("bf16", "int64", True, False, "int64", 1.0),
])
def test_element_dtype_and_byte_scale(precision, dtype, is_param, keeps, stored, scale):
    assert P.element_dtype(precision, dtype, is_param, keeps) == stored
    assert P.byte_scale(precision, dtype, is_param, keeps) == scale


def test_amp_keeps_softmax_losses_reductions_and_their_gradients_in_fp32():
    for op in ("Softmax", "SoftmaxWithLoss", "LabelCrossEntropy", "SigmoidCrossEntropyWithLogits", "AveragedLoss",
               "ReduceSum", "ReduceMean", "SumElements", "LayerNorm", "Exp", "Log", "Pow",
               "SoftmaxGradient", "AveragedLossGradient"):
        assert op in P.AMP_FP32_OPS, op
    for op in ("Conv", "FC", "MatMul", "Relu", "Add", "MaxPool", "SpatialBN"):
        assert op not in P.AMP_FP32_OPS, op


def test_the_plan_document_accepts_exactly_the_precisions():
    literal = typing.get_args(PlanDocument.model_fields["precision"].annotation)[0]
    assert typing.get_args(literal) == P.PRECISIONS


def test_resolve_writes_what_ran():
    assert P.resolve(None, {"float32", "int32"}, True) == "fp32"
    assert P.resolve(None, {"float16", "int32"}, True) == "fp16"
    assert P.resolve("amp", {"float32"}, True) == "amp"
    assert P.resolve("amp", {"float32"}, False) == "fp32"      # no GPU: the net's own dtypes ran
    assert P.resolve("fp16", {"bfloat16"}, False) == "bf16"


# -- the cost model -------------------------------------------------------------------------

def _machine(gpus: int = 1, profile: str = "a100-40gb-sxm4"):
    import argparse
    return machine_from_args(argparse.Namespace(machine=None, gpus=gpus, gpu_profile=profile, cpu_profile=None,
                                                gpu_link=None, gpu_link_count=None, profile=None))


def _softmax_net(folder: Path) -> dict:
    """x -> FC -> Relu -> FC -> Softmax: the Softmax output is one amp keeps in fp32."""
    b = NetBuilder("smx")
    b.input("x", (64, 512))
    b.param("w1", (512, 512), "XavierFill")
    b.param("b1", (512,), "ConstantFill", value=0.0)
    b.param("w2", (10, 512), "XavierFill")
    b.param("b2", (10,), "ConstantFill", value=0.0)
    b.op("FC", ["x", "w1", "b1"], "h", name="fc1")
    b.op("Relu", ["h"], "r", name="relu")
    b.op("FC", ["r", "w2", "b2"], "logits", name="fc2")
    b.op("Softmax", ["logits"], "prob", name="softmax")
    b.output("prob")
    return b.save(folder, "smx")


@pytest.fixture
def softmax_typed(tmp_path):
    from placer.formats import load_net
    paths = _softmax_net(tmp_path)
    return infer(load_net(paths["predict"], init_path=paths["init"]), {"x": TensorType((64, 512))}), paths


def test_auto_and_fp32_price_a_float32_net_exactly_as_before(softmax_typed):
    typed, _ = softmax_typed
    machine = _machine()
    base = annotate(typed, machine)
    for precision in (None, "fp32"):
        c = annotate(typed, machine, precision=precision)
        assert c.precision == "fp32" and c.model.precision == precision
        assert c.ops.equals(base.ops) and (c.op_s == base.op_s).all()
        assert (c.tensors.nbytes == base.tensors.nbytes).all()


def test_annotate_sizes_tensors_by_the_precision(softmax_typed):
    typed, _ = softmax_typed
    machine = _machine()
    base = annotate(typed, machine)
    raw = dict(zip(base.tensors.names, base.tensors.nbytes.tolist()))
    for precision, expect in (("fp16", {"x": 0.5, "w1": 0.5, "r": 0.5, "logits": 0.5}),
                              ("amp", {"x": 0.5, "w1": 1.0, "r": 0.5, "logits": 0.5})):
        c = annotate(typed, machine, precision=precision)
        sized = dict(zip(c.tensors.names, c.tensors.nbytes.tolist()))
        assert {b: sized[b] / raw[b] for b in expect} == expect, precision
        ops = c.ops.set_index("name")
        # the Softmax output: autocast keeps it in fp32 under amp; a .half() net does not
        assert ops.loc["softmax", "output_bytes"] == 64 * 10 * (4 if precision == "amp" else 2)
        assert ops.loc["fc1", "param_bytes"] == base.ops.set_index("name").loc["fc1", "param_bytes"] \
            * (1.0 if precision == "amp" else 0.5)
    # a given model's precision wins over the argument
    c = annotate(typed, machine, model=CostModel.for_machine(machine, precision="fp16"), precision="amp")
    assert c.precision == "fp16"


def test_a_cpu_only_machine_runs_the_nets_own_dtypes(softmax_typed):
    typed, _ = softmax_typed
    machine = _machine(gpus=0)
    base = annotate(typed, machine)
    for precision in P.PRECISIONS:
        c = annotate(typed, machine, precision=precision)
        assert c.precision == "fp32" and c.model.precision is None
        assert c.ops.equals(base.ops) and (c.op_s == base.op_s).all()
        assert (c.tensors.nbytes == base.tensors.nbytes).all()


# -- placer plan --------------------------------------------------------------------------

@pytest.fixture
def mixed(tmp_path) -> dict:
    return mixed_net(tmp_path)


def _plan(capsys, paths, *extra) -> dict:
    return plan_doc(capsys, paths["predict"], "--init-net", paths["init"], *QUICK, *extra)


def _copy_bytes(doc: dict) -> dict:
    return {(c["tensor"], c["direction"]): c["bytes"] for c in doc["copies"]}


def _param_bytes(doc: dict) -> dict:
    return {t["name"]: t["bytes"] for t in doc["tensors"] if t["producer"] == -2}


def test_amp_halves_activation_copies_and_keeps_parameter_bytes(capsys, mixed):
    fp32 = _plan(capsys, mixed)
    amp = _plan(capsys, mixed, "--precision", "amp")
    fp16 = _plan(capsys, mixed, "--precision", "fp16")
    assert fp32["precision"] == "fp32" and amp["precision"] == "amp" and fp16["precision"] == "fp16"
    base = _copy_bytes(fp32)
    assert set(base) == {("x", "h2d"), ("prob", "d2h")}      # the input in, the output back
    # placement unchanged (the GPU wins the MLP either way), so the same copies, at half the bytes
    assert _copy_bytes(amp) == {k: v / 2 for k, v in base.items()}
    assert _copy_bytes(fp16) == {k: v / 2 for k, v in base.items()}
    params = _param_bytes(fp32)
    assert params["w1"] == 1024 * 1024 * 4
    assert _param_bytes(amp) == params
    assert _param_bytes(fp16) == {k: v / 2 for k, v in params.items()}
    gpu = lambda d: d["memory"]["cuda:0"]["param_bytes"]  # noqa: E731
    assert gpu(amp) == gpu(fp32) and gpu(fp16) == gpu(fp32) / 2


def test_amp_keeps_the_softmax_output_copy_in_fp32(capsys, tmp_path):
    paths = _softmax_net(tmp_path)
    on_gpu = ("--gpu-profile", "a100-40gb-sxm4", "--pin", "*=gpu")   # every op on the GPU: copies x in, prob out
    fp32 = _plan(capsys, paths, *on_gpu)
    amp = _plan(capsys, paths, *on_gpu, "--precision", "amp")
    ops = {o["name"]: o["device"] for o in amp["ops"]}
    assert ops["softmax"] != "cpu" and ops == {o["name"]: o["device"] for o in fp32["ops"]}
    assert _copy_bytes(amp)[("prob", "d2h")] == _copy_bytes(fp32)[("prob", "d2h")] == 64 * 10 * 4
    assert _copy_bytes(amp)[("x", "h2d")] == _copy_bytes(fp32)[("x", "h2d")] / 2


def test_plans_on_a_cpu_only_machine_are_identical_with_and_without_precision(capsys, mixed):
    base = _plan(capsys, mixed, "--gpus", "0")
    for precision in P.PRECISIONS:
        assert _plan(capsys, mixed, "--gpus", "0", "--precision", precision) == base
    assert base["precision"] == "fp32"


def test_the_table_and_the_report_name_the_precision(capsys, mixed, tmp_path):
    report = tmp_path / "r.html"
    rc, out, err = cli_plan(capsys, mixed["predict"], "--init-net", mixed["init"], *QUICK, "--precision", "bf16",
                            "--report", report)
    assert rc == 0, err
    # the default V100 has no bfloat16 peak: the line and the header say what it was priced in
    note = "NVIDIA V100 PCIe 16 GB has no bfloat16 peak: its conv and GEMM work is priced in float16"
    assert f"precision: bf16 ({note})" in out
    assert f"<th>precision</th><td>bf16 ({note})</td>" in report.read_text()


# -- placer report ---------------------------------------------------------------------------

def _plan_file(capsys, paths, folder: Path, *extra) -> Path:
    out = folder / "plan.json"
    rc, _, err = cli_plan(capsys, paths["predict"], "--init-net", paths["init"], *QUICK, "--plan-out", out, *extra)
    assert rc == 0, err
    return out


def _report(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_report_uses_the_plans_precision_and_refuses_another(capsys, mixed, tmp_path):
    plan = _plan_file(capsys, mixed, tmp_path, "--precision", "amp")
    assert json.loads(plan.read_text())["precision"] == "amp"
    page = tmp_path / "r.html"
    assert _report(capsys, plan, "-o", page)[0] == 0
    assert "<th>precision</th><td>amp</td>" in page.read_text()
    assert _report(capsys, plan, "-o", page, "--precision", "amp")[0] == 0
    rc, out, err = _report(capsys, plan, "-o", tmp_path / "other.html", "--precision", "fp16")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "priced in amp, not fp16" in err and not (tmp_path / "other.html").exists()


def test_an_old_plan_without_precision_still_reads(capsys, mixed, tmp_path):
    plan = _plan_file(capsys, mixed, tmp_path)
    doc = json.loads(plan.read_text())
    del doc["precision"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert read_plan(old).precision is None
    page = tmp_path / "old.html"
    assert _report(capsys, old, "-o", page)[0] == 0
    assert "<th>precision</th><td>not recorded" in page.read_text()
    # --precision names it for such a plan
    assert _report(capsys, old, "-o", page, "--precision", "tf32")[0] == 0
    assert "<th>precision</th><td>tf32</td>" in page.read_text()
    doc["precision"] = "fp8"
    old.write_text(json.dumps(doc))
    rc, _, err = _report(capsys, old, "-o", page)
    assert rc == 2 and "precision" in err and len(err.strip().splitlines()) == 1


# -- placer shard ---------------------------------------------------------------------------

SHARD = ("shard", "--dlrm", "small", "--global-batch", "1024", "--gpu-profile", "v100-16gb-sxm2", "--gpus", "2",
         "--gpu-link", "nvlink2", "--time-limit", "1", "--search-time", "0.2", "--degrees", "2", "--json")


def _shard(capsys, *extra) -> dict:
    capsys.readouterr()
    assert cli.main([*SHARD, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_shard_records_the_precision_and_fp16_halves_table_bytes(capsys):
    auto = _shard(capsys)
    fp16 = _shard(capsys, "--precision", "fp16")
    amp = _shard(capsys, "--precision", "amp")
    assert (auto["precision"], fp16["precision"], amp["precision"]) == ("fp32", "fp16", "amp")
    total = lambda d: sum(t["bytes"] for t in d["tables"])  # noqa: E731
    assert total(fp16) == total(auto) / 2       # a .half() net: every table row 2-byte
    assert total(amp) == total(auto)            # amp: parameters (tables) stay fp32


# -- train nets: in-place outputs --------------------------------------------------------------

def test_a_train_steps_output_bytes_halve_under_fp16_in_place_outputs_included():
    """SpatialBN of a train net writes Y and its running statistics, the latter in place;
    the step takes the in-place ones off (they add no memory) at the size they were counted."""
    from test_training_plan_memory import V100, bundled

    from placer.formats import load_net
    from placer.shapes import require_complete
    from placer.training.placement import step_costs
    train, init, shapes = bundled("resnet_small_train")
    typed = require_complete(infer(load_net(train, init_path=init, input_shapes=shapes), shapes))
    fp32 = step_costs(typed, annotate(typed, V100))[0].ops["output_bytes"].to_numpy()
    fp16 = step_costs(typed, annotate(typed, V100, precision="fp16"))[0].ops["output_bytes"].to_numpy()
    floats = [all(t is None or t.dtype == "float32" for t in typed.op_outputs[op.index]) for op in typed.net.ops]
    inplace = [any(b in op.inputs for b in op.outputs) and len(op.outputs) > 1 for op in typed.net.ops]
    assert any(f and i and fp32[k] > 0 for k, (f, i) in enumerate(zip(floats, inplace)))   # such ops are there
    for k, f in enumerate(floats):
        if f:
            assert fp16[k] == fp32[k] / 2, typed.net.ops[k].label
