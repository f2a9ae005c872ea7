"""`placer profile`: a tiny net on the CPU writes a valid profile, a second run merges,
--host characterises the CPU, --link without a GPU exits 2 with one line; the link
profiler itself runs on a GPU (marked gpu)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer.cli import main
from placer.hardware.device_profile import load_profile
from placer.types import TensorType

NET = '''name: "tiny"
op { type: "FC" input: "data" input: "w1" input: "b1" output: "h" }
op { type: "Relu" input: "h" output: "h" }
op { type: "FC" input: "h" input: "w2" input: "b2" output: "y" }
op { type: "Relu" input: "y" output: "y2" }
op { type: "Softmax" input: "y2" output: "p" }
external_input: "data" external_input: "w1" external_input: "b1"
external_input: "w2" external_input: "b2"
external_output: "p"
'''
INIT = '''op { output: "w1" type: "GivenTensorFill" arg { name: "shape" ints: 16 ints: 8 } }
op { output: "b1" type: "GivenTensorFill" arg { name: "shape" ints: 16 } }
op { output: "w2" type: "GivenTensorFill" arg { name: "shape" ints: 16 ints: 16 } }
op { output: "b2" type: "GivenTensorFill" arg { name: "shape" ints: 16 } }
'''


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "net.pbtxt").write_text(NET)
    (tmp_path / "init.pbtxt").write_text(INIT)
    return tmp_path


def _profile(tiny, batch, out):
    return main(["profile", str(tiny / "net.pbtxt"), "--init-net", str(tiny / "init.pbtxt"),
                 "--input", f"data={batch},8", "--device", "cpu", "--repeats", "3", "--warmup", "1",
                 "--quiet", "-o", str(out)])


def test_profile_cpu_writes_then_merges(tiny, capsys):
    """The init net gives shapes only, so the net cannot run whole: ops are timed alone."""
    out = tiny / "prof.json"
    assert _profile(tiny, 4, out) == 0
    assert "timing each op alone instead" in capsys.readouterr().err
    cpu = load_profile(out).device("cpu")
    assert {t.method for t in cpu.ops.values()} == {"isolated"}
    assert cpu.source["kind"] == "measured" and cpu.source["date"]
    # 5 ops, but the two Relu at [4,16] share a key: 4 distinct timings
    assert len(cpu.ops) == 4
    types = sorted(t.type for t in cpu.ops.values())
    assert types == ["FC", "FC", "Relu", "Softmax"]
    relu = next(t for t in cpu.ops.values() if t.type == "Relu")
    assert relu.inputs == (TensorType((4, 16)),) and relu.samples == 3 and relu.median_s > 0
    assert relu.iqr_s >= 0 and relu.bytes == 2 * 4 * 16 * 4
    assert {"fc", "elementwise"} <= set(cpu.fits)
    first = {k: t.median_s for k, t in cpu.ops.items()}

    assert _profile(tiny, 32, out) == 0  # another batch: new keys added, old ones kept
    cpu = load_profile(out).device("cpu")
    assert len(cpu.ops) == 8
    assert all(cpu.ops[k].median_s == v for k, v in first.items())
    assert cpu.fits["fc"].points == 4
    json.loads(out.read_text())  # still plain JSON


RUNNABLE_INIT = INIT.replace('type: "GivenTensorFill"', 'type: "XavierFill"')


def test_profile_times_ops_in_a_run_of_the_whole_net_by_default(tiny, capsys):
    (tiny / "init.pbtxt").write_text(RUNNABLE_INIT)
    out = tiny / "prof.json"
    assert _profile(tiny, 4, out) == 0
    printed = capsys.readouterr().out
    assert "timed 4 distinct ops of 5 in-network" in printed
    assert "covered" in printed and "median err %" in printed          # the fit table with its quality
    cpu = load_profile(out).device("cpu")
    assert {t.method for t in cpu.ops.values()} == {"in-network"}
    relu = next(t for t in cpu.ops.values() if t.type == "Relu")
    assert relu.samples == 2 * 3                                       # two Relus at [4,16] x three runs
    assert all(f.spread_pct is not None and f.p90_abs_pct_error is not None for f in cpu.fits.values())

    assert main(["profile", str(tiny / "net.pbtxt"), "--init-net", str(tiny / "init.pbtxt"), "--input",
                 "data=4,8", "--isolated", "--repeats", "3", "--quiet", "-o", str(out)]) == 0
    cpu = load_profile(out).device("cpu")
    assert {t.method for t in cpu.ops.values()} == {"isolated"}        # the same keys, timed again alone
    assert next(t for t in cpu.ops.values() if t.type == "Relu").samples == 3


def test_profile_calibrate_covers_depthwise_and_grouped_convs(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["profile", "--calibrate", "--threads", "1", "--repeats", "1", "--warmup", "0", "--quiet",
                 "-o", str(out)]) == 0
    cpu = load_profile(out).device("cpu")
    assert {t.method for t in cpu.ops.values()} == {"in-network"}
    for group in ("type:Conv/depthwise", "type:Conv/grouped", "type:Conv/k1", "type:Conv/k3", "type:FC",
                  "type:SparseLengthsSum", "type:Concat/few", "type:Concat/many", "type:MaxPool", "type:Relu"):
        assert cpu.fits[group].points >= 2, group
    assert "calibration_b4: timed" in capsys.readouterr().out


def test_profile_host(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert main(["profile", "--host", "-o", str(out)]) == 0
    cpu = load_profile(out).device("cpu")
    assert cpu.peak_flops["float32"] > 1e9          # any real machine does a GFLOP/s
    assert cpu.memory_bandwidth_bytes_per_s > 1e8
    assert 0 < cpu.launch_overhead_s < 1e-3
    assert "GFLOP/s" in capsys.readouterr().out


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("placer: error: ") and "Traceback" not in err
    return err


def test_link_without_gpu_exits_2(tmp_path, capsys):
    from conftest import gpu_available
    if gpu_available():
        pytest.skip("a GPU is visible")
    err = _one_line_error(capsys, ["profile", "--link", "--device", "cuda:0", "-o", str(tmp_path / "l.json")])
    assert "GPU" in err
    assert not (tmp_path / "l.json").exists()
    err = _one_line_error(capsys, ["profile", "net.pbtxt", "--device", "cuda:0", "-o", str(tmp_path / "l.json")])
    assert "--device cuda:0 needs a CUDA GPU" in err


def test_bad_mode_combinations(tiny, capsys):
    assert "exactly one" in _one_line_error(capsys, ["profile", "--host", "--link", "-o", "x.json"])
    assert "cuda" in _one_line_error(capsys, ["profile", "--link", "--device", "cpu", "-o", "x.json"])
    assert "not a JSON profile" in _one_line_error(
        capsys, ["profile", "--host", "-o", str(tiny / "net.pbtxt")])


def test_net_without_shapes_says_what_to_add(tiny, capsys):
    err = _one_line_error(capsys, ["profile", str(tiny / "net.pbtxt"), "--device", "cpu", "--quiet",
                                   "-o", str(tiny / "none.json")])
    assert "no op could be timed" in err and "--init-net" in err
    assert not (tiny / "none.json").exists()


def test_index_inputs_are_valid():
    from placer.profiling.bench import make_inputs
    from placer.types import Args, Op
    rng = np.random.default_rng(0)
    op = Op(0, "SparseLengthsSum", ("t", "i", "l"), ("o",), Args({}))
    table, idx, lengths = make_inputs(op, [TensorType((50, 4)), TensorType((37,), "int64"),
                                           TensorType((8,), "int32")], rng)
    assert idx.dtype == np.int64 and idx.min() >= 0 and idx.max() < 50
    assert lengths.sum() == 37 and lengths.dtype == np.int32 and lengths.min() >= 4
    op = Op(0, "SoftmaxWithLoss", ("x", "label"), ("p", "loss"), Args({}))
    _, label = make_inputs(op, [TensorType((6, 10)), TensorType((6,), "int32")], rng)
    assert label.max() < 10 and label.min() >= 0
    op = Op(0, "BatchGather", ("d", "i"), ("o",), Args({}))
    _, i = make_inputs(op, [TensorType((3, 5, 2)), TensorType((7,), "int32")], rng)
    assert i.max() < 5


@pytest.mark.gpu
def test_link_curves_on_gpu():
    from placer.profiling.link import measure_link
    sizes = [4096 * 4 ** k for k in range(6)]  # 4 KiB .. 4 MiB, quick
    link = measure_link(0, sizes=sizes, repeats=3)
    for direction in ("h2d", "d2h"):
        for mem in ("pinned", "pageable"):
            curve = link[direction][mem]
            assert [p[0] for p in curve.points] == sizes
            assert curve.points[-1][1] > curve.points[0][1]   # 1024x more bytes take longer
            assert 1e8 < curve.bytes_per_s < 1e12 and curve.latency_s < 1e-3


@pytest.mark.gpu
def test_profile_cuda_ops(tiny):
    out = tiny / "gpu.json"
    rc = main(["profile", str(tiny / "net.pbtxt"), "--init-net", str(tiny / "init.pbtxt"),
               "--input", "data=4,8", "--device", "cuda:0", "--repeats", "3", "--quiet", "-o", str(out)])
    assert rc == 0
    gpu = load_profile(out).device("gpu")
    assert len(gpu.ops) == 4 and gpu.source["kind"] == "measured"


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["mnist_lenet.prototxt", "squeezenet_v1.0_deploy.prototxt"])
def test_profile_corpus_net(corpus, tmp_path, name):
    out = tmp_path / "c.json"
    rc = main(["profile", str(corpus / "caffe" / name), "--input", "data=1,3,227,227"
               if "squeeze" in name else "data=1,1,28,28", "--device", "cpu", "--repeats", "1",
               "--warmup", "0", "--budget", "0", "--quiet", "-o", str(out)])
    assert rc == 0
    cpu = load_profile(out).device("cpu")
    assert {"Conv", "MaxPool"} <= {t.type for t in cpu.ops.values()}
    assert all(t.median_s > 0 for t in cpu.ops.values())
