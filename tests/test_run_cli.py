"""``placer run`` from the command line, and the progress line."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from placer import cli
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import save_netdef
from placer.progress import Progress

from placer.runtime.executor import Executor

from conftest import gpu_available
from test_runtime_multigpu import expected_link_bytes, feeds, placed_net, random_net

RNG = np.random.default_rng(11)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((3, 8)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def write_net(path, device=None):
    """x -> FC(w, b) -> Relu -> y; every op on ``device`` (None: no annotation)."""
    net = pb.NetDef(name="cli_net", external_input=["x", "w", "b"], external_output=["y"])
    for type_, ins, outs in (("FC", ["x", "w", "b"], ["h"]), ("Relu", ["h"], ["y"])):
        o = net.op.add(type=type_, input=ins, output=outs)
        if device is not None:
            o.device_option.device_type = device
    save_netdef(net, path)
    return path


@pytest.fixture
def restore_blas_threads():
    from placer.runtime import threads
    before = threads.get_blas_threads()
    yield
    if before is not None:
        threads.set_blas_threads(before)


def run_cli(capsys, *argv):
    code = cli.main(["run", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_cpu_net_from_npz_writes_outputs_and_record(tmp_path, capsys):
    net = write_net(tmp_path / "net.pbtxt")
    np.savez(tmp_path / "in.npz", x=X, w=W, b=B)
    code, out, err = run_cli(capsys, net, "--inputs", tmp_path / "in.npz", "--iterations", 3,
                             "--outputs", tmp_path / "out.npz", "--record", tmp_path / "run.json")
    assert code == 0, err
    assert "FC" in out and "Relu" in out and "total" in out and "cpu" in out
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["y"], np.maximum(X @ W.T + B, 0), rtol=1e-5, atol=1e-6)
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["schema"] == "placer.run_record" and rec["iterations"] == 3
    assert [o["type"] for o in rec["ops"]] == ["FC", "Relu"] and not rec["emulated"]
    assert all(len(o["samples_s"]) == 3 for o in rec["ops"])


def test_random_inputs_need_shapes_and_give_the_same_run_for_a_seed(tmp_path, capsys):
    net = write_net(tmp_path / "net.pbtxt")
    outs = []
    for i in range(2):
        code, out, err = run_cli(capsys, net, "--input", "x=4,8", "--input", "w=3,8", "--input", "b=3",
                                 "--random-inputs", 5, "--quiet", "--outputs", tmp_path / f"o{i}.npz")
        assert code == 0, err
        assert out == ""  # --quiet: no table
        outs.append(np.load(tmp_path / f"o{i}.npz")["y"])
    assert outs[0].shape == (4, 3) and np.array_equal(outs[0], outs[1])
    code, _, err = run_cli(capsys, net, "--quiet")
    assert code == 2 and "no shape" in err and "--input" in err


def test_gpu_net_without_gpu_asks_for_emulation_and_runs_emulated(tmp_path, capsys):
    net = write_net(tmp_path / "net.pbtxt", device=1)
    np.savez(tmp_path / "in.npz", x=X, w=W, b=B)
    if not gpu_available():
        code, _, err = run_cli(capsys, net, "--inputs", tmp_path / "in.npz")
        assert code == 2 and ("no CUDA GPU visible" in err or "cupy is not installed" in err) and "--emulate-gpu" in err
    code, out, err = run_cli(capsys, net, "--inputs", tmp_path / "in.npz", "--emulate-gpu")
    assert code == 0, err
    assert "emulated-cuda:0 (CPU timing)" in out and "times are CPU times" in out


def test_missing_input_in_npz_lists_expected(tmp_path, capsys):
    net = write_net(tmp_path / "net.pbtxt")
    np.savez(tmp_path / "in.npz", x=X, w=W)
    code, _, err = run_cli(capsys, net, "--inputs", tmp_path / "in.npz")
    assert code == 2 and "'b' is missing" in err and "the net expects: x" in err


def test_refuses_to_overwrite_the_net(tmp_path, capsys):
    net = write_net(tmp_path / "net.pbtxt")
    before = net.read_bytes()
    code, _, err = run_cli(capsys, net, "--input", "x=4,8", "--input", "w=3,8", "--input", "b=3",
                           "--outputs", net)
    assert code == 2 and "refusing to overwrite" in err and net.read_bytes() == before


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_silent_off_a_terminal_and_when_quiet():
    for stream, quiet in ((io.StringIO(), False), (FakeTTY(), True)):
        with Progress(10, "run", quiet=quiet, stream=stream) as p:
            for i in range(10):
                p.update(i + 1)
        assert stream.getvalue() == ""


def test_progress_draws_step_elapsed_and_time_left_on_a_terminal():
    stream = FakeTTY()
    p = Progress(10, "run", stream=stream)
    p.update(10)
    p.done = 5
    line = p.line(now=p.start + 4.0)
    assert "5/10" in line and "0:04 elapsed" in line and "0:04 left" in line
    assert "10/10" in stream.getvalue()
    p.close()
    assert stream.getvalue().endswith("\r\x1b[K")


@pytest.mark.corpus
def test_caffe_lenet_placed_by_rewrite_runs_emulated_with_the_same_outputs(corpus, tmp_path, capsys,
                                                                            restore_blas_threads):
    """The same random weights (seeded per parameter) and inputs give the same outputs
    whether the net runs unplaced on the CPU or placed half on an emulated GPU."""
    from placer.rewrite import netdef as rewrite
    from placer.formats import load_net
    from placer.hardware.machine import load_machine
    src = corpus / "caffe" / "mnist_lenet.prototxt"
    net = load_net(src)
    placement = [1 if op.type in ("Conv", "Relu") else 0 for op in net.ops]    # cuda:0 or the host
    placed = rewrite.place(net, placement, load_machine("2x-t4-pcie3"))
    save_netdef(placed.predict, tmp_path / "placed.pbtxt")
    save_netdef(placed.init, tmp_path / "placed_init.pbtxt")
    code, out, err = run_cli(capsys, src, "--random-inputs", 1, "--outputs", tmp_path / "cpu.npz", "--threads", 1)
    assert code == 0, err
    code, out, err = run_cli(capsys, tmp_path / "placed.pbtxt", "--init-net", tmp_path / "placed_init.pbtxt",
                             "--input", "data=64,1,28,28", "--random-inputs", 1, "--emulate-gpu", "--threads", 1,
                             "--outputs", tmp_path / "gpu.npz", "--record", tmp_path / "run.json")
    assert code == 0, err
    assert "CopyCPUToGPU" in out and "emulated-cuda:0" in out
    cpu, gpu = np.load(tmp_path / "cpu.npz"), np.load(tmp_path / "gpu.npz")
    assert set(cpu.files) == set(gpu.files) and cpu.files
    for name in cpu.files:
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-5, atol=1e-6)
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["emulated"] and rec["copy_bytes"]["h2d"] > 0 and rec["peak_bytes"]["emulated-cuda:0"] > 0


def test_threads_option_sets_the_blas_thread_count(tmp_path, capsys):
    from placer.runtime import threads
    before = threads.get_blas_threads()
    if before is None:
        pytest.skip("numpy here is not linked to an OpenBLAS with a thread setter")
    try:
        net = write_net(tmp_path / "net.pbtxt")
        np.savez(tmp_path / "in.npz", x=X, w=W, b=B)
        code, _, err = run_cli(capsys, net, "--inputs", tmp_path / "in.npz", "--threads", 1, "--quiet")
        assert code == 0, err
        assert threads.get_blas_threads() == 1 and "warning" not in err
    finally:
        threads.set_blas_threads(before)


def test_trace_of_a_measured_run_is_a_valid_chrome_trace(tmp_path):
    from placer.report.trace import validate_trace
    net = write_net(tmp_path / "net.pbtxt")
    np.savez(tmp_path / "in.npz", x=X, w=W, b=B)
    code = cli.main(["run", str(net), "--inputs", str(tmp_path / "in.npz"), "--quiet",
                     "--iterations", "2", "--trace", str(tmp_path / "trace.json")])
    assert code == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert validate_trace(trace) == []
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert [e["args"].get("type") for e in ops] == ["FC", "Relu"]
    assert all(e["dur"] >= 0 for e in ops)


def test_run_cli_emulates_four_gpus_and_reports_devices_and_links(tmp_path, capsys):
    """A random net over the CPU and four GPUs: the table shows every GPU and link, the
    record the bytes per link the placed net's copies move; too few GPUs is one line."""
    rng = np.random.default_rng(5)
    net = random_net(rng, 10, "given")
    dev = np.array([1, 2, 3, 4, 0, 1, 2, 3, 4, 1])
    placed, p = placed_net(net, dev)
    save_netdef(p.predict, tmp_path / "placed.pbtxt")
    save_netdef(p.init, tmp_path / "placed_init.pbtxt")
    feed = feeds(net, rng)
    np.savez(tmp_path / "in.npz", **feed)
    argv = ["run", str(tmp_path / "placed.pbtxt"), "--init-net", str(tmp_path / "placed_init.pbtxt"),
            "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz"),
            "--record", str(tmp_path / "run.json")]
    assert cli.main(argv + ["--emulate-gpus", "4"]) == 0
    out = capsys.readouterr().out
    for i in range(4):
        assert f"emulated-cuda:{i} (CPU timing):" in out
    assert "link cpu -> emulated-cuda:0: " in out and "link emulated-cuda:0 -> emulated-cuda:1: " in out
    want = Executor(net).run(feed)
    with np.load(tmp_path / "out.npz") as got:
        assert set(got.files) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["link_bytes"] == expected_link_bytes(placed, feed)
    assert set(rec["peak_bytes"]) == {"cpu"} | {f"emulated-cuda:{i}" for i in range(4)}
    assert rec["schema_version"] == 1 and {"ops", "devices", "copy_bytes", "total_s"} <= set(rec)
    # three emulated GPUs are too few for cuda:3: one line, exit 2
    (tmp_path / "out.npz").unlink()
    assert cli.main(argv + ["--emulate-gpus", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("placer: error: ") and "cuda:3" in err and "--emulate-gpus 4" in err
    with pytest.raises(SystemExit) as refused:   # argparse: "argument --emulate-gpus: expected an integer >= 1"
        cli.main(argv[:2] + ["--emulate-gpus", "0"])
    assert refused.value.code == 2 and "argument --emulate-gpus" in capsys.readouterr().err


# ---------------------------------------------------------------- memory, priced before allocating

def _mlp(tmp_path, rows=4, cols=100):
    from fuzz_cases import FC_NET, fc_init
    (tmp_path / "mlp.pbtxt").write_text(FC_NET)
    (tmp_path / "init.pbtxt").write_text(fc_init(rows, cols))
    return tmp_path / "mlp.pbtxt", tmp_path / "init.pbtxt"


def _tib(n: float) -> str:
    from placer.runtime.footprint import format_bytes
    return format_bytes(n)


@pytest.mark.parametrize("seed", [[], ["--random-inputs", "3"]])
def test_a_run_that_cannot_fit_is_refused_with_both_figures(tmp_path, capsys, monkeypatch, seed):
    """data 1e10 x 100 float32 through FC(4) and Relu: numpy would have asked for 7.28 TiB
    (the float64 draw) and failed. Counted by hand: weights 4x100 + 4 and the input 4e12 B
    held throughout, then the larger of the draw (8e12 B, float64) and the activations
    alive at the FC (the executor's copy of the input, 4e12 B; the FC's output, 1e10 x 4
    float32, and its temporaries, a quarter of that: ops/fc.py FC_SCRATCH)."""
    net, init = _mlp(tmp_path)
    monkeypatch.chdir(tmp_path)   # the paths a user types: the whole figure fits the line
    code, out, err = run_cli(capsys, net.name, "--init-net", init.name, "--input", "data=10000000000,100", "--quiet",
                             *seed)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and len(err) < 300
    params, inputs, draw, activations = (4 * 100 + 4) * 4, 4e12, 8e12, 4e12 + 1.25 * 1e10 * 4 * 4
    assert f"needs {_tib(params + inputs + max(draw, activations))} of memory" in err
    assert (f"(parameters {_tib(params)} + inputs 3.64 TiB + max(peak activations "
            f"{_tib(activations)}, random draw 7.28 TiB))") in err
    assert " available (" in err and "--input" in err


def test_run_footprint_counts_what_the_executor_keeps_alive():
    """x(2x8) -> FC(w 3x8, b 3) -> h(2x3) -> Relu -> y(2x3), by hand: parameters (27
    floats) and the fed x (16) throughout; at the FC the executor's copy of x (16), h (6)
    and the FC's temporaries (a quarter of h's 24 bytes: ops/fc.py FC_SCRATCH) are alive,
    more than h and y (12) at the Relu."""
    from placer.formats.caffe2 import net_from_netdef, parse_text
    from placer.runtime.footprint import run_footprint
    from placer.shapes import infer
    from placer.types import TensorType
    from fuzz_cases import FC_NET, fc_init
    net = net_from_netdef(parse_text(FC_NET), parse_text(fc_init(3, 8)))
    typed = infer(net, {"data": TensorType((2, 8))})
    fp = run_footprint(typed, ["data"], random_inputs=False)
    assert dict(fp.held) == {"parameters": 27 * 4, "inputs": 16 * 4}
    assert dict(fp.phases) == {"peak activations": 22 * 4 + 6, "random draw": 0}
    assert fp.total_bytes == (27 + 16 + 22) * 4 + 6
    drawn = run_footprint(typed, ["data"], random_inputs=True)
    assert drawn.total_bytes == (27 + 16) * 4 + 16 * 8  # the float64 draw outweighs the activations


def test_an_npz_whose_header_claims_terabytes_is_refused_before_reading(tmp_path, capsys):
    from fuzz_cases import npy_header_only, npz
    net, init = _mlp(tmp_path, 4, 8)
    (tmp_path / "in.npz").write_bytes(npz({"data": npy_header_only((2 ** 40, 1))}))
    code, out, err = run_cli(capsys, net, "--init-net", init, "--inputs", tmp_path / "in.npz", "--quiet")
    assert code == 2 and err.count("\n") == 1
    assert f"reading {tmp_path / 'in.npz'} needs 4 TiB of memory" in err


def test_profile_refuses_an_op_that_cannot_fit(tmp_path, capsys):
    net, init = _mlp(tmp_path)
    code = cli.main(["profile", str(net), "--init-net", str(init), "--input", "data=10000000000,100",
                     "-o", str(tmp_path / "p.json"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "timing op #0 FC -> 'fc' needs" in err and not (tmp_path / "p.json").exists()


def test_negative_random_input_seed_is_refused(tmp_path, capsys):
    net, init = _mlp(tmp_path, 4, 8)
    with pytest.raises(SystemExit) as refused:
        run_cli(capsys, net, "--init-net", init, "--input", "data=2,8", "--random-inputs", "-1")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "argument --random-inputs: expected an integer >= 0, found '-1'" in err


def test_random_inputs_of_a_placed_lookup_net_are_those_of_its_unplaced_net(tmp_path, capsys):
    """A placed net's fed indices and lengths are first read by their copies to the GPUs;
    random inputs follow the copies to the lookups that use them (the lengths summed to
    more than the indices before), so the placed run gives the original's outputs."""
    from placer.examples import DATA
    net = str(DATA / "dlrm_small.pbtxt")
    out = tmp_path / "placed.pbtxt"
    assert cli.main(["plan", net, "--machine", "8x-a100-40gb-nvswitch", "--pin", "emb:::sls1*=cuda:5",
                     "--pin", "emb:::sls2*=cuda:7", "--pin", "top*=cuda:3", "-o", str(out),
                     "--init-out", str(tmp_path / "init.pbtxt")]) == 0
    assert "CopyCPUToGPU" in out.read_text()
    assert cli.main(["run", str(out), "--init-net", str(tmp_path / "init.pbtxt"), "--emulate-gpus", "8",
                     "--random-inputs", "3", "--outputs", str(tmp_path / "placed.npz")]) == 0
    assert cli.main(["run", net, "--random-inputs", "3", "--outputs", str(tmp_path / "cpu.npz")]) == 0
    placed, cpu = np.load(tmp_path / "placed.npz"), np.load(tmp_path / "cpu.npz")
    assert sorted(placed) == sorted(cpu) == ["prob_click"]
    np.testing.assert_allclose(placed["prob_click"], cpu["prob_click"], rtol=1e-5, atol=1e-6)
