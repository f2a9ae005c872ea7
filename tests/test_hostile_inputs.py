"""Hostile input on the command line: every case is refused in one short line on stderr
with exit code 2 (1 where the output, not the input, is at fault), no traceback, and
nothing written; values that would be used as they stand (a NaN learning rate, an int32
image fed to a float32 blob) are refused, not used."""
from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placer.cli import main
from placer.errors import PlacerError
from placer.ops import registry
from placer.planning.view import json_text
from placer.types import Args, TensorType

ROOT = Path(__file__).resolve().parent.parent
MAX_LINE = 300

BASE = '''name: "hostile"
input: "data" input_shape { dim: 2 dim: 3 dim: 4 dim: 4 }
'''
RELU = 'layer { name: "relu" type: "ReLU" bottom: "data" top: "r" }\n'
LOSS_NET = '''name: "loss_net"
input: "data" input_shape { dim: %d dim: 6 }
input: "label" input_shape { dim: %d }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 5 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def _refused(capsys, argv, rc=2) -> str:
    """Run the CLI; check the one-line contract; return the line."""
    capsys.readouterr()
    try:
        got = main([str(a) for a in argv])
    except SystemExit as e:  # argparse refused an option (its converter, placer.arguments)
        got = e.code
    out, err = capsys.readouterr()
    assert got == rc, (got, err)
    assert err.count("\n") == 1 and err.startswith("placer"), err     # "placer: " or "placer CMD: "
    assert len(err) < MAX_LINE, err
    assert "Traceback" not in out + err
    return err.strip()


def _file(tmp_path, name, text) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _caffe(tmp_path, layers: str, head: str = BASE) -> Path:
    return _file(tmp_path, "net.prototxt", head + layers)


# ------------------------------------------------------------------ Caffe layer setup

AXIS_LAYERS = [
    ("concat", RELU + 'layer { name: "c" type: "Concat" bottom: "data" bottom: "r" top: "c" '
                      'concat_param { axis: 7 } }', "concat_param.axis 7"),
    ("concat_negative", RELU + 'layer { name: "c" type: "Concat" bottom: "data" bottom: "r" top: "c" '
                               'concat_param { axis: -5 } }', "concat_param.axis -5"),
    ("slice", 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" slice_param { axis: 9 } }',
     "slice_param.axis 9"),
    ("tile", 'layer { name: "t" type: "Tile" bottom: "data" top: "a" tile_param { axis: 9 tiles: 2 } }',
     "tile_param.axis 9"),
    ("reshape_axis", 'layer { name: "r" type: "Reshape" bottom: "data" top: "a" '
                     'reshape_param { shape { dim: 0 dim: -1 } axis: 9 } }', "outside its 4-D input"),
    ("reshape_zeros", 'layer { name: "r" type: "Reshape" bottom: "data" top: "a" reshape_param '
                      '{ shape { dim: 0 dim: 0 dim: 0 dim: 0 dim: 0 dim: 0 } } }', "a 0 copies an input axis"),
    ("reshape_count", 'layer { name: "r" type: "Reshape" bottom: "data" top: "a" '
                      'reshape_param { shape { dim: 5 dim: -1 } } }', "cannot be inferred"),
    ("flatten", 'layer { name: "f" type: "Flatten" bottom: "data" top: "a" flatten_param { axis: 9 } }',
     "flatten_param.axis 9"),
    ("softmax_negative", 'layer { name: "s" type: "Softmax" bottom: "data" top: "a" softmax_param { axis: -9 } }',
     "softmax_param.axis -9"),
    ("inner_product", 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a" '
                      'inner_product_param { num_output: 3 axis: 9 } }', "inner_product_param.axis 9"),
    ("scale_num_axes", 'layer { name: "s" type: "Scale" bottom: "data" top: "a" scale_param { axis: 2 num_axes: 5 } }',
     "past the end"),
    ("slice_points", 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" '
                     'slice_param { axis: 1 slice_point: 1 slice_point: 2 } }', "one fewer than the tops"),
    ("slice_uneven", 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" slice_param { axis: 1 } }',
     "divide it evenly"),
    # Caffe's own setup checks, by layer (EltwiseLayer, PoolingLayer, LRNLayer::LayerSetUp)
    ("eltwise_coeffs", RELU + 'layer { name: "e" type: "Eltwise" bottom: "data" bottom: "r" top: "e" '
                              'eltwise_param { operation: SUM coeff: 1 coeff: 2 coeff: 3 } }',
     "3 coeff value(s) for 2 bottoms"),
    ("global_pooling_kernel", 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                              'pooling_param { pool: MAX global_pooling: true kernel_size: 2 } }',
     "global_pooling with a kernel size"),
    ("lrn_even", 'layer { name: "l" type: "LRN" bottom: "data" top: "l" lrn_param { local_size: 4 } }',
     "local_size 4"),
]


@pytest.mark.parametrize("command", ["inspect", "convert", "run"])
@pytest.mark.parametrize("case, layers, words", AXIS_LAYERS, ids=[c[0] for c in AXIS_LAYERS])
def test_caffe_layer_caffe_refuses_is_refused(capsys, tmp_path, command, case, layers, words):
    net = _caffe(tmp_path, layers)
    out = tmp_path / "out"
    argv = [command, net] + (["-o", out] if command == "convert" else [])
    line = _refused(capsys, argv)
    assert f"{net}:" in line and "layer '" in line and words in line, line
    assert not out.exists()


def test_caffe_input_dim_needs_four(capsys, tmp_path):
    net = _file(tmp_path, "two.prototxt", 'name: "t"\ninput: "data" input_dim: 2 input_dim: 3\n' + RELU)
    line = _refused(capsys, ["inspect", net])
    assert "2 input_dim value(s) for 1 input(s)" in line and "four per input" in line


def test_caffe_input_dim_with_input_shape(capsys, tmp_path):
    net = _file(tmp_path, "both.prototxt", BASE + "input_dim: 2 input_dim: 3 input_dim: 4 input_dim: 4\n" + RELU)
    assert "both input_shape and input_dim" in _refused(capsys, ["inspect", net])


# ------------------------------------------------------------------ op shape functions

def _argument_names() -> dict[str, bool]:
    """Every argument an op reads through a typed getter (``args.int("axis")``, ...), from
    the op modules' source: name -> whether it is read as a list (``ints`` / ``floats``)."""
    names: dict[str, bool] = {}
    for path in sorted((ROOT / "placer" / "ops").glob("*.py")):
        for getter, name in re.findall(r'args\.(int|ints|float|floats|bool)\("([A-Za-z0-9_.]+)"', path.read_text()):
            names[name] = names.get(name, False) or getter.endswith("s")
    return names


ARGUMENT_NAMES = _argument_names()
# Out of range for any axis, index, count or size: past the rank, negative, zero, past int32.
OUT_OF_RANGE = (9, -9, 0, -1, 2 ** 40, -2 ** 40)


def _op_samples():
    """(op type, input types, args, declared outputs): a case of every registered op from
    the conformance data, else four-dimensional float32 inputs as many as it needs."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cases import data_ops, dense, gradients, optimizers, spatial
    found = {}
    for module in (dense, spatial, data_ops, gradients, optimizers):
        for case in [*getattr(module, "CASES", []), *getattr(module, "FORWARD_CASES", [])]:
            types = [_spec_type(spec) for spec in case["inputs"]]
            if case["op"] not in found and None not in types:
                found[case["op"]] = (types, case["args"], case.get("n_outputs"))
    for op_type in registry.all_types():
        if op_type not in found:
            opdef = registry.get(op_type)
            found[op_type] = ([TensorType((2, 3, 4, 5))] * max(opdef.min_inputs, 1), {}, None)
    return sorted(found.items())


def _spec_type(spec) -> TensorType | None:
    """The type of a conformance case's input spec; None for one made by another op."""
    if not isinstance(spec, dict) or spec.get("kind") == "forward":
        return None
    if spec.get("kind") == "given":
        return TensorType(np.shape(spec["values"]), spec["dtype"])
    return TensorType(tuple(spec["shape"]), spec.get("dtype", "float32")) if "shape" in spec else None


OP_SAMPLES = _op_samples()


def test_every_registered_op_has_a_sample():
    assert {t for t, _ in OP_SAMPLES} == set(registry.all_types())


def test_the_ops_read_axis_arguments():
    assert {"axis", "axes", "starts", "ends", "split", "dims", "num_classes"} <= set(ARGUMENT_NAMES)
    assert ARGUMENT_NAMES["axes"] and not ARGUMENT_NAMES["axis"]


@pytest.mark.parametrize("op_type, sample", OP_SAMPLES, ids=[t for t, _ in OP_SAMPLES])
def test_op_shape_functions_refuse_arguments_out_of_range(op_type, sample):
    """Every argument an op reads set out of range (an axis past the rank, a negative or
    huge count; lists of one and of four such values): infer, cost and the launch count
    return, or raise a PlacerError naming the op, never IndexError, MemoryError, ..."""
    inputs, args, n_outputs = sample
    opdef = registry.get(op_type)
    for name, is_list in ARGUMENT_NAMES.items():
        for bad in OUT_OF_RANGE:
            for value in ([bad], [bad] * 4) if is_list else (bad,):
                given = Args({**args, name: value}, op=f"#0 {op_type} 'x'", n_outputs=n_outputs)
                try:
                    outputs = opdef.infer(inputs, given)
                    if outputs and all(o is not None for o in outputs):
                        opdef.cost(inputs, outputs, given)
                        opdef.launch_count(inputs, given)
                except PlacerError as e:  # anything else fails the test
                    assert "#0" in str(e) and op_type in str(e), str(e)


def test_concat_axis_out_of_range_names_the_op():
    concat = registry.get("Concat")
    x = TensorType((2, 3, 4))
    with pytest.raises(PlacerError, match=r"op #0 Concat 'c'.*axis 9 is out of range for 3 dimensions"):
        concat.infer([x, x], Args({"axis": 9}, op="#0 Concat 'c'", n_outputs=2))


# ------------------------------------------------------------------ standard output

class _FullStream:
    """A standard output on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        pass


def test_stdout_that_cannot_be_written_is_one_line(capsys, tmp_path, monkeypatch):
    net = _caffe(tmp_path, RELU)
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _FullStream())
    rc = main(["inspect", str(net)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "No space left on device" in err and len(err) < MAX_LINE


@pytest.mark.skipif(not os.path.exists("/dev/full") and os.environ.get("CI", "").lower() != "true",
                    reason="needs /dev/full (Linux); under CI=true its absence is a failure")
def test_stdout_to_dev_full_in_a_real_process(tmp_path):
    """The interpreter's own flush at exit must not print a traceback either."""
    net = _caffe(tmp_path, RELU)
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "placer.cli", "inspect", str(net)], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot write the output" in proc.stderr, proc.stderr


def test_unexpected_exception_is_one_line_naming_debug(capsys, tmp_path, monkeypatch):
    import placer.commands.inspect as inspect_command

    def broken(args):
        print("half a table")
        raise RuntimeError("something placer did not expect\nover two lines")
    monkeypatch.setattr(inspect_command, "run", broken)
    line = _refused(capsys, ["inspect", _caffe(tmp_path, RELU)], rc=1)
    assert line.startswith("placer: internal error: RuntimeError: something placer did not expect\\n")
    assert "--debug" in line
    with pytest.raises(RuntimeError):
        main(["--debug", "inspect", str(_caffe(tmp_path, RELU))])


def test_out_of_memory_is_one_line(capsys, tmp_path, monkeypatch):
    import placer.commands.inspect as inspect_command

    def exhausted(args):
        raise MemoryError()
    monkeypatch.setattr(inspect_command, "run", exhausted)
    line = _refused(capsys, ["inspect", _caffe(tmp_path, RELU)])
    assert line.startswith("placer: error: out of memory") and "--input" in line


# ------------------------------------------------------------------ --input

def test_input_dimension_of_5000_digits(capsys, tmp_path):
    line = _refused(capsys, ["inspect", _caffe(tmp_path, RELU), "--input", "data=" + "9" * 5000 + ",8"])
    assert "--input data=" in line and "5000 digits" in line and "int64" in line


def test_input_dimension_past_int64(capsys, tmp_path):
    line = _refused(capsys, ["inspect", _caffe(tmp_path, RELU), "--input", "data=" + "9" * 20 + ",8"])
    assert "20 digits" in line


# ------------------------------------------------------------------ batch 0

def _train_net(capsys, tmp_path, batch: int) -> list[str]:
    net = _file(tmp_path, "loss.prototxt", LOSS_NET % (batch, batch))
    out = tmp_path / f"train{batch}"
    assert main(["train-net", str(net), "--loss", "loss", "--optimizer", "sgd", "--lr", "0.1", "-o", str(out)]) == 0
    capsys.readouterr()
    return [str(out / "train_net.pbtxt"), "--init-net", str(out / "train_init_net.pbtxt"),
            "--input", f"data={batch},6", "--input", f"label={batch}:int32"]


def test_shard_refuses_a_batch_zero_train_net(capsys, tmp_path):
    train = _train_net(capsys, tmp_path, 0)
    for extra in ([], ["--global-batch", "4"]):
        line = _refused(capsys, ["shard", *train, "--machine", "4x-v100-sxm2-nvlink", *extra])
        assert "batch 0" in line and "at least one sample" in line


def test_a_batch_zero_train_step_runs(capsys, tmp_path):
    """An empty batch trains a step (the FC gradient of no rows is a sum of nothing), where
    the gradient kernels failed to reshape zero rows."""
    train = _train_net(capsys, tmp_path, 0)
    out = tmp_path / "out.npz"
    assert main(["run", *train, "--outputs", str(out), "--quiet"]) == 0, capsys.readouterr().err
    loss = np.load(out)["loss"]
    assert loss.shape == () and np.isfinite(loss)


# ------------------------------------------------------------------ train-net and solver numbers

@pytest.mark.parametrize("options, words", [
    (["--lr", "nan"], "argument --lr: expected a positive number, found 'nan'"),
    (["--lr", "inf"], "argument --lr: expected a positive number, found 'inf'"),
    (["--lr", "-0.1"], "argument --lr: expected a positive number, found '-0.1'"),
    (["--lr", "fast"], "argument --lr: expected a positive number, found 'fast'"),
    (["--lr", "0.1", "--momentum", "nan"], "argument --momentum: expected a momentum from 0 to below 1"),
    (["--lr", "0.1", "--momentum", "5"], "argument --momentum: expected a momentum from 0 to below 1"),
    (["--lr", "0.1", "--epsilon", "-1"], "argument --epsilon: expected a positive number, found '-1'"),
    (["--lr", "0.1", "--weight-decay", "inf"], "argument --weight-decay: expected a number >= 0, found 'inf'"),
    (["--lr", "0.1", "--lr-policy", "step", "--lr-arg", "stepsize=10", "--lr-arg", "gamma=nan"],
     "gamma=nan': nan is not a finite number"),
])
def test_train_net_numbers_are_refused(capsys, tmp_path, options, words):
    net = _file(tmp_path, "loss.prototxt", LOSS_NET % (2, 2))
    out = tmp_path / "train"
    line = _refused(capsys, ["train-net", net, "--loss", "loss", "--optimizer", "momentum", *options, "-o", out])
    assert words in line, line
    assert not out.exists()


@pytest.mark.parametrize("solver, words", [
    ("base_lr: nan", "base_lr: nan must be positive"),
    ("base_lr: -0.1", "base_lr: -0.1 must be positive"),
    ("base_lr: 0.1 momentum: 5", "momentum: 5 must be from 0 to below 1 for SGD"),
    ("base_lr: 0.1 weight_decay: inf", "weight_decay: inf must be 0 or more"),
    ('base_lr: 0.1 type: "Adam" momentum: 0.9 momentum2: 1.5', "momentum2: 1.5 must be from 0 to below 1 for Adam"),
    ('base_lr: 0.1 type: "AdaGrad" delta: -1', "delta: -1 must be positive"),
])
def test_solver_numbers_are_refused(capsys, tmp_path, solver, words):
    net = _file(tmp_path, "loss.prototxt", LOSS_NET % (2, 2))
    path = _file(tmp_path, "solver.prototxt", solver + ' lr_policy: "fixed"\n')
    out = tmp_path / "out"
    line = _refused(capsys, ["convert", net, "--solver", path, "-o", out])
    assert f"{path}: " in line and words in line, line
    assert not out.exists()


# ------------------------------------------------------------------ fed arrays

@pytest.mark.parametrize("dtype, words", [
    ("int32", "is int32; the net reads it as float32"),
    ("bool", "is bool; the net reads it as float32"),
    ("float64", "is float64; the net reads it as float32"),
    ("complex64", "is complex64, not a Caffe2 tensor type"),
])
def test_fed_array_of_another_dtype_is_refused(capsys, tmp_path, dtype, words):
    net = _caffe(tmp_path, RELU)
    feed = tmp_path / f"x_{dtype}.npz"
    np.savez(feed, data=np.ones((2, 3, 4, 4), dtype=dtype))
    out = tmp_path / "out.npz"
    line = _refused(capsys, ["run", net, "--inputs", feed, "--outputs", out])
    assert f"{feed}: array 'data' {words}" in line, line
    assert not out.exists()


def test_fed_float32_and_int_labels_run(capsys, tmp_path):
    """The positive side: the declared dtype runs, and labels take an integer dtype."""
    net = _file(tmp_path, "loss.prototxt", LOSS_NET % (2, 2))
    feed = tmp_path / "batch.npz"
    np.savez(feed, data=np.ones((2, 6), np.float32), label=np.array([1, 3], np.int32))
    out = tmp_path / "out.npz"
    assert main(["run", str(net), "--inputs", str(feed), "--outputs", str(out), "--quiet"]) == 0
    assert np.load(out)["loss"].dtype == np.float32


# ------------------------------------------------------------------ messages that say what is wrong

def test_gpu_reserve_names_the_forms_it_reads(capsys, tmp_path):
    line = _refused(capsys, ["plan", _caffe(tmp_path, RELU), "--gpu-reserve", "50"])
    assert "read as a fraction" in line and "10%" in line and "0.1" in line


def test_shard_degree_zero_is_not_a_batch_problem(capsys, tmp_path):
    line = _refused(capsys, ["shard", "--dlrm", "small", "--machine", "4x-v100-sxm2-nvlink", "--degrees", "0"])
    assert "--degrees 0" in line and "1 or more" in line and "split evenly" not in line


def test_report_of_a_run_record_says_which_option_takes_it(capsys, tmp_path):
    record = _file(tmp_path, "run.json", json.dumps({"schema": "placer.run_record", "ops": []}))
    out = tmp_path / "r.html"
    line = _refused(capsys, ["report", record, "-o", out])
    assert f"{record}: this is a run record" in line and "--run RUN.json" in line
    assert not out.exists()


def test_plan_json_is_strict_json():
    """No Infinity or NaN tokens: a value that is not finite is null (docs/PLAN_JSON.md)."""
    doc = {"total_s": float("inf"), "gap": float("nan"), "ops": [{"time_s": {"cpu": 1.5, "cuda:0": float("inf")}}],
           "timeline": [1.0, float("-inf")]}
    text = json_text(doc)
    refuse = lambda name: pytest.fail(f"{name} in the plan JSON")  # noqa: E731
    assert json.loads(text, parse_constant=refuse) == {
        "total_s": None, "gap": None, "ops": [{"time_s": {"cpu": 1.5, "cuda:0": None}}], "timeline": [1.0, None]}


def test_layer_line_is_the_layers_when_the_net_has_its_name(capsys, tmp_path):
    net = _file(tmp_path, "t.prototxt", BASE.replace('"hostile"', '"t"') +
                'layer { name: "t" type: "Tile" bottom: "data" top: "a" tile_param { axis: 9 tiles: 2 } }\n')
    assert f"{net}:3: layer 't' (Tile)" in _refused(capsys, ["inspect", net])


def test_gpu_link_count_below_one(capsys, tmp_path):
    line = _refused(capsys, ["plan", _caffe(tmp_path, RELU), "--gpus", "2", "--gpu-link", "nvlink2",
                             "--gpu-link-count", "-1"])
    assert "argument --gpu-link-count: expected an integer >= 1, found '-1'" in line


def test_emulate_gpus_past_a_machine(capsys, tmp_path):
    line = _refused(capsys, ["run", _caffe(tmp_path, RELU), "--emulate-gpus", "9" * 15])
    assert "--emulate-gpus 999999999999999: placer models at most 256 GPUs in one machine" in line
