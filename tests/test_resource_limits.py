"""Resources refused before they are spent, and errors that stay one short line.

Every CLI case runs ``placer`` in a subprocess whose address space is capped at 3 GiB
(``RLIMIT_AS``): an allocation of the sizes involved (a 5 GiB file read whole, a 1.76 GB
Logit and its temporaries) would fail there with a MemoryError instead of passing
quietly. Each must exit 2 with one line of under 300 characters, and quickly: on the
2-core development host these took 1.0-3.4 s of wall time each, most of it the
interpreter starting (importing numpy, protobuf and placer); the bound asserted is 10 s,
for a loaded shared host.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fuzz_cases import FC_NET, fc_init

ROOT = Path(__file__).resolve().parent.parent
ADDRESS_SPACE = 3 * 2**30
WALL_BOUND_S = 10.0
LINE_BOUND = 300
LOGIT_NET = 'name: "l"\nop { type: "Logit" input: "x" output: "y" }\nexternal_input: "x"\nexternal_output: "y"\n'


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def placer(*argv, cwd: Path) -> tuple[int, str, float]:
    """(exit code, stderr, wall seconds) of ``placer ARGV`` under the address-space cap."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "placer.cli", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=_cap_address_space)
    return proc.returncode, proc.stderr, time.monotonic() - start


def refused(*argv, cwd: Path) -> str:
    """The one error line of a refused command (asserting the exit code, the line and the time)."""
    code, err, wall = placer(*argv, cwd=cwd)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and "MemoryError" not in err, err[-2000:]
    assert err.count("\n") == 1 and err.startswith("placer: error: "), err[:2000]
    assert len(err) < LINE_BOUND, err
    assert wall < WALL_BOUND_S, f"{wall:.1f} s: {err}"
    return err


@pytest.fixture
def relu(tmp_path) -> Path:
    path = tmp_path / "relu.pbtxt"
    path.write_text('name: "r"\nop { type: "Relu" input: "x" output: "y" }\n'
                    'external_input: "x"\nexternal_output: "y"\n')
    return path


# ---------------------------------------------------------------- net and weights files

def test_a_device_is_refused_before_reading(tmp_path):
    err = refused("inspect", "/dev/zero", cwd=tmp_path)
    assert "/dev/zero: is a character device, not a regular file" in err


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "net.pb"
    os.mkfifo(fifo)
    err = refused("inspect", fifo.name, cwd=tmp_path)
    assert "net.pb: is a FIFO (named pipe), not a regular file" in err


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    assert "d: is a directory, not a file" in refused("inspect", "d", cwd=tmp_path)


def test_an_init_net_from_a_device_is_refused(tmp_path, relu):
    err = refused("inspect", relu.name, "--init-net", "/dev/urandom", cwd=tmp_path)
    assert "/dev/urandom: is a character device" in err


def test_caffe_weights_from_a_device_are_refused(tmp_path):
    (tmp_path / "deploy.prototxt").write_text(
        'name: "c"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 4\ninput_dim: 4\n'
        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n')
    err = refused("inspect", "deploy.prototxt", "--weights", "/dev/zero", cwd=tmp_path)
    assert "/dev/zero: is a character device" in err


def test_a_file_past_protobufs_limit_is_refused_by_its_size(tmp_path):
    """5 GiB (sparse: no disk used): over the 2 GiB - 1 that protobuf can parse."""
    big = tmp_path / "big.pb"
    with open(big, "wb") as f:
        f.truncate(5 * 2**30)
    err = refused("inspect", big.name, cwd=tmp_path)
    assert "big.pb: 5 GiB: over protobuf's message limit of 2 GiB" in err


def test_a_file_too_large_to_parse_in_memory_names_its_size_and_the_limit(tmp_path):
    """1.5 GiB of zero bytes (binary by its first bytes): 2.5x that, 3.75 GiB, cannot be
    parsed in a 3 GiB address space."""
    mid = tmp_path / "mid.pb"
    with open(mid, "wb") as f:
        f.truncate(3 * 2**29)
    err = refused("inspect", mid.name, cwd=tmp_path)
    assert "mid.pb: 1.5 GiB of binary protobuf: parsing it takes about 3.75 GiB (2.5x)" in err
    assert "available (address-space limit" in err


def test_an_npz_from_a_device_is_refused(tmp_path, relu):
    err = refused("run", relu.name, "--inputs", "/dev/zero", cwd=tmp_path)
    assert "/dev/zero: is not a regular file" in err


# ---------------------------------------------------------------- memory of a run

@pytest.mark.parametrize("command", ["run", "profile"])
def test_a_kernels_temporaries_count_in_the_memory_check(tmp_path, command):
    """Logit of 440e6 float32 (1.64 GiB a blob): the input, the executor's copy of it, and
    at the op its output and two more arrays of temporaries (ops/elementwise.py
    _UNARY_SCRATCH): 5 x 1.64 = 8.2 GiB, refused in a 3 GiB address space. Without the
    temporaries and the copy (3.28 GiB of activations) the check was passed and the run
    died at 5.1 GB after 22 s."""
    (tmp_path / "logit.pbtxt").write_text(LOGIT_NET)
    extra = ["-o", "p.json"] if command == "profile" else []
    err = refused(command, "logit.pbtxt", "--input", "x=440000000", "--quiet", *extra, cwd=tmp_path)
    blob = 440_000_000 * 4 / 2**30
    assert f"needs {5 * blob:.3g} GiB of memory" in err
    assert f"{4 * blob:.3g} GiB" in err  # the activations (copy, output, temporaries)
    assert not (tmp_path / "p.json").exists()


def test_too_many_emulated_gpus_are_refused_like_gpus(tmp_path, relu):
    err = refused("run", relu.name, "--input", "x=2", "--emulate-gpus", 10**9, cwd=tmp_path)
    assert "--emulate-gpus 1000000000: placer models at most 256 GPUs in one machine" in err


# ---------------------------------------------------------------- errors stay short

def test_a_syntax_error_at_the_end_of_a_10_mb_line_keeps_file_line_and_column(tmp_path):
    """A string that never closes: protobuf finds out at the end of the 10 MB line and
    quotes the whole token (the message was 10 MB long)."""
    (tmp_path / "long.pbtxt").write_text('name: "x' + "a" * 10_000_000 + " ")
    err = refused("inspect", "long.pbtxt", cwd=tmp_path)
    assert err.startswith("placer: error: long.pbtxt:1:7: not a valid Caffe2 NetDef: 'name: \"xaaa")
    assert "aaa...aaa" in err


def test_a_syntax_error_after_many_fields_is_quoted_in_short():
    """100,000 fields on one line and a bad token at its end (parsed in-process: the text
    parser takes about 2 s over these 2 MB): file, line and column stay, the quote of the
    line is cut."""
    from placer.errors import NetParseError
    from placer.formats.caffe2 import parse_text
    text = 'name: "x" ' + 'external_input: "a" ' * 100_000 + "@@@"
    with pytest.raises(NetParseError) as e:
        parse_text(text, "long.pbtxt")
    assert str(e.value).startswith(f"long.pbtxt:1:{len(text) - 2}: not a valid Caffe2 NetDef: ")
    assert len(str(e.value)) < LINE_BOUND and "...: Expected identifier or number, got @." in str(e.value)


def test_a_rank_200000_fill_is_quoted_in_short(tmp_path):
    (tmp_path / "p.pbtxt").write_text('name: "p"\nop { type: "Relu" input: "y" output: "z" }\nexternal_output: "z"\n')
    from placer.formats import caffe2_pb as pb
    init = pb.NetDef(name="i")   # binary: the text parser would take seconds over 200,000 ints
    fill = init.op.add(type="ConstantFill", output=["y"])
    fill.arg.add(name="shape", ints=[1] * 199_999 + [-1])
    (tmp_path / "init.pb").write_bytes(init.SerializeToString())
    err = refused("inspect", "p.pbtxt", "--init-net", "init.pb", cwd=tmp_path)
    assert "init.pb: the init net's fill of 'y': shape 1x1x1" in err
    assert "...x1x1x" in err and "x1x-1 (rank 200000) has a negative dimension" in err


def test_a_shape_past_float_range_is_named_not_an_overflow(tmp_path):
    """2^200000 elements cannot be written as a float: the count is a power of two."""
    from placer.types import shape_problem
    problem = shape_problem([2] * 200_000)
    assert problem.endswith("(rank 200000) has about 2^200000 elements, more than int64 can count (2^63 - 1)")
    assert len(problem) < 200


def test_one_line_cuts_the_middle_and_keeps_the_head_and_the_hint():
    from placer.errors import MAX_MESSAGE_CHARS, NetParseError, PlacerError, one_line
    e = NetParseError("net.pbtxt", "bad token " + "y" * 10_000 + " at the end", line=3, column=7,
                      hint="fix the text at that position")
    line = one_line(e)
    assert len(line) == MAX_MESSAGE_CHARS
    assert line.startswith("net.pbtxt:3:7: bad token yyy") and line.endswith("y at the end (fix the text at that position)")
    assert one_line(PlacerError("short", hint="try this")) == "short (try this)"
    assert one_line(PlacerError("a\nb")) == "a\\nb"   # one line: control characters escaped


# ---------------------------------------------------------------- timing statistics

def test_running_times_match_the_exact_figures_of_a_short_run():
    from placer.runtime.timing import RESERVOIR_SAMPLES, RunningTimes
    samples = list(np.random.default_rng(3).exponential(1e-3, RESERVOIR_SAMPLES))
    times = RunningTimes()
    for s in samples:
        times.add(s)
    assert times.samples == tuple(samples)                 # every sample, in order
    assert times.median == statistics.median(samples)     # the same values: one sort of the same floats
    assert times.count == len(samples)
    assert times.minimum == min(samples) and times.maximum == max(samples)
    # Welford's one-pass mean and spread against two-pass float64 sums of 256 terms:
    # relative error of order 256 * 2^-53, far below 1e-12
    assert times.mean == pytest.approx(statistics.fmean(samples), rel=1e-12)
    assert times.std == pytest.approx(statistics.stdev(samples), rel=1e-12)


def test_running_times_stay_bounded_and_sample_uniformly():
    from placer.runtime.timing import RESERVOIR_SAMPLES, RunningTimes
    times = RunningTimes()
    n = 100_000
    for k in range(n):
        times.add(float(k))
    assert times.count == n and len(times.samples) == RESERVOIR_SAMPLES
    assert times.minimum == 0.0 and times.maximum == n - 1 and times.mean == pytest.approx((n - 1) / 2)
    assert times.std == pytest.approx(math.sqrt(n * (n + 1) / 12), rel=1e-9)   # variance of 0..n-1
    # a uniform sample of 256 of 0..n-1: its median is within 4 standard errors of n/2
    # (rank standard error sqrt(0.25 / 256) = 1/32 of n)
    assert abs(times.median - n / 2) < 4 * n / 32


def test_a_run_record_keeps_every_sample_of_a_short_run():
    """Three timed runs: the record's samples are the three timer readings and its time
    their median, as before running figures; count, mean, min and max are over them."""
    from placer.formats.caffe2 import net_from_netdef, parse_text
    from placer.runtime import record as run_record
    from placer.runtime.executor import Executor
    from placer.types import TensorType
    net = net_from_netdef(parse_text(FC_NET), parse_text(fc_init(3, 8)))
    ex = Executor(net)
    ex.input_types["data"] = TensorType((2, 8))
    ex.run({"data": np.ones((2, 8), np.float32)}, iterations=3, warmup=1)
    for o in ex.record.ops:
        assert len(o.samples_s) == 3 and o.count == 3
        assert o.time_s == statistics.median(o.samples_s)
        assert (o.min_s, o.max_s) == (min(o.samples_s), max(o.samples_s))
        assert o.mean_s == pytest.approx(statistics.fmean(o.samples_s), rel=1e-12)
    back = run_record.from_dict(run_record.to_dict(ex.record))
    assert back == ex.record
    older = run_record.to_dict(ex.record)                 # a file written before the running figures
    for o in older["ops"]:
        for key in ("count", "mean_s", "std_s", "min_s", "max_s"):
            del o[key]
    again = run_record.from_dict(older)
    assert [o.count for o in again.ops] == [3, 3]
    assert [o.max_s for o in again.ops] == [o.max_s for o in ex.record.ops]


def test_a_long_run_keeps_a_bounded_sample_and_the_count():
    from placer.formats.caffe2 import net_from_netdef, parse_text
    from placer.runtime.executor import Executor
    from placer.runtime.timing import RESERVOIR_SAMPLES
    from placer.types import TensorType
    net = net_from_netdef(parse_text(FC_NET), parse_text(fc_init(3, 8)))
    ex = Executor(net)
    ex.input_types["data"] = TensorType((2, 8))
    n = RESERVOIR_SAMPLES + 100
    ex.run({"data": np.ones((2, 8), np.float32)}, iterations=n, warmup=0)
    for o in ex.record.ops:
        assert o.count == n and len(o.samples_s) == RESERVOIR_SAMPLES
        assert o.min_s <= o.time_s <= o.max_s and o.min_s <= o.mean_s <= o.max_s
    assert ex.record.iterations == n


# ---------------------------------------------------------------- declared temporaries hold

def _unary_cases():
    from placer.ops.elementwise import _UNARY
    return sorted(_UNARY)


@pytest.mark.parametrize("op_type", [*_unary_cases(), "FC"])
def test_a_kernels_measured_temporaries_stay_within_its_declaration(op_type):
    """tracemalloc's peak during the numpy kernel, less its outputs, is at most what its
    registry entry declares (plus 64 KiB for numpy's and Python's small objects): a kernel
    changed to build more temporaries fails here, not in a user's run."""
    from placer.ops import registry
    from placer.types import Args, TensorType
    rng = np.random.default_rng(0)
    if op_type == "FC":
        inputs = [rng.standard_normal((256, 1024), np.float32), rng.standard_normal((512, 1024), np.float32),
                  rng.standard_normal(512, np.float32)]
    else:
        inputs = [rng.random(1 << 20, np.float32) * 0.98 + 0.01]
    opdef, args = registry.get(op_type), Args({}, op=op_type)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        outputs = opdef.kernel(np, inputs, args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    out_types = [TensorType(o.shape, str(o.dtype)) for o in outputs]
    declared = opdef.scratch_bytes([TensorType(a.shape, str(a.dtype)) for a in inputs], out_types, args)
    assert peak - sum(o.nbytes for o in outputs) <= declared + 64 * 1024


def test_running_out_of_memory_anyway_is_one_line(monkeypatch, capsys, relu):
    """An allocation the checks did not foresee still ends in one line and exit 2."""
    import placer.commands.inspect as inspect_command
    from placer import cli

    def exhausts(args):
        raise MemoryError()
    monkeypatch.setattr(inspect_command, "run", exhausts)
    assert cli.main(["inspect", str(relu)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("placer: error: out of memory: ") and "--input" in err
    with pytest.raises(MemoryError):
        cli.main(["--debug", "inspect", str(relu)])
