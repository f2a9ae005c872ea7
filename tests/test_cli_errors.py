"""Bad input on the command line: one line on stderr, exit code 2, no traceback (--debug
shows it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placer.cli import main
from placer.errors import NetParseError, PlacerError

FC_NET = '''name: "mlp"
op { input: "data" input: "fc_w" input: "fc_b" output: "fc" type: "FC" }
external_input: "data" external_input: "fc_w" external_input: "fc_b"
external_output: "fc"
'''
FC_INIT = '''op { output: "fc_w" type: "GivenTensorFill" arg { name: "shape" ints: 10 ints: 99 } }
op { output: "fc_b" type: "GivenTensorFill" arg { name: "shape" ints: 10 } }
'''


def _fails(capsys, argv):
    """Run the CLI; check the one-line error contract; return the line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1, err
    assert err.startswith("placer: error: ")
    assert "Traceback" not in err + out
    return err.strip()


def _file(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)


def test_missing_file(capsys, tmp_path):
    line = _fails(capsys, ["inspect", str(tmp_path / "nope.pbtxt")])
    assert "nope.pbtxt: no such file" in line


def test_not_a_net(capsys, tmp_path):
    p = _file(tmp_path, "noise.pb", bytes(range(256)) * 8)
    assert "not a net" in _fails(capsys, ["inspect", p])


def test_empty_file(capsys, tmp_path):
    p = _file(tmp_path, "empty.pbtxt", "")
    assert "empty file" in _fails(capsys, ["inspect", p])


def test_syntax_error_has_file_line_column(capsys, tmp_path):
    p = _file(tmp_path, "bad.pbtxt", 'name: "x"\nop {\n  type: "Relu"\n  input "a"\n}\n')
    line = _fails(capsys, ["inspect", p])
    assert f"{p}:4:" in line


def test_blob_used_before_it_is_produced(capsys, tmp_path):
    p = _file(tmp_path, "cycle.pbtxt", '''op { input: "b" output: "a" type: "Relu" }
op { input: "a" output: "b" type: "Relu" }
external_input: "x"''')
    line = _fails(capsys, ["inspect", p])
    assert "reads blob 'b' before it is produced" in line and "cycle" in line


def test_blob_never_produced(capsys, tmp_path):
    p = _file(tmp_path, "dangling.pbtxt", 'op { input: "x" output: "y" type: "Relu" }')
    assert "reads blob 'x', which no earlier op makes" in _fails(capsys, ["inspect", p])


def test_fc_weight_that_does_not_fit(capsys, tmp_path):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    init = _file(tmp_path, "init.pbtxt", FC_INIT)
    line = _fails(capsys, ["inspect", net, "--init-net", init, "--input", "data=4,100"])
    assert "'data'" in line and "'fc_w'" in line
    assert "float32[4,100]" in line and "float32[10,99]" in line


@pytest.mark.parametrize("spec, words", [
    ("data", "expected NAME=d0,d1"),
    ("data=1,x,3", "dimension 'x'"),
    ("data=1,3:floaty", "unknown dtype 'floaty'"),
    ("=1,2", "expected NAME=d0,d1"),
    ("nothere=1,2", "no blob 'nothere'"),
])
def test_malformed_input(capsys, tmp_path, spec, words):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    assert words in _fails(capsys, ["inspect", net, "--input", spec])


def test_bad_init_nets(capsys, tmp_path):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    assert "nope.pb: no such file" in _fails(capsys, ["inspect", net, "--init-net", str(tmp_path / "nope.pb")])
    proto = _file(tmp_path, "deploy.prototxt", 'name: "n"\nlayer {\n  name: "a"\n}\n')
    assert "init net is a Caffe prototxt" in _fails(capsys, ["inspect", net, "--init-net", proto])


def test_caffemodel_given_as_net(capsys, tmp_path):
    p = _file(tmp_path, "w.caffemodel", b"\n\x03net\xa2\x06\x05\n\x03abc")
    line = _fails(capsys, ["inspect", p])
    assert "--weights" in line


@pytest.mark.parametrize("where", ["top", "command"])
def test_debug_shows_the_traceback(tmp_path, where):
    argv = ["inspect", str(tmp_path / "nope.pbtxt")]
    argv = ["--debug", *argv] if where == "top" else [*argv, "--debug"]
    with pytest.raises(NetParseError):
        main(argv)


def test_errors_are_placer_errors_not_crashes(tmp_path):
    """Every case above is a PlacerError underneath (what --debug re-raises)."""
    p = _file(tmp_path, "bad.pbtxt", "op {")
    with pytest.raises(PlacerError):
        main(["--debug", "inspect", p])


# ---------------------------------------------------------------- outputs that cannot be written

def _mlp_args(tmp_path):
    return [_file(tmp_path, "mlp.pbtxt", FC_NET), "--init-net", _file(tmp_path, "init.pbtxt", FC_INIT),
            "--input", "data=4,99"]


@pytest.mark.parametrize("where, words", [
    ("a-file/sub/placed.pbtxt", "Not a directory"),
    ("/proc/placer-no-such-dir/placed.pbtxt", "No such file or directory"),
    (".", "is a folder"),
])
def test_an_output_path_that_cannot_be_written_is_one_line(capsys, tmp_path, monkeypatch, where, words):
    monkeypatch.chdir(tmp_path)
    _file(tmp_path, "a-file", "x")
    line = _fails(capsys, ["plan", *_mlp_args(tmp_path), "-o", where])
    assert f"{where}: cannot write: {words}" in line


def test_a_read_only_folder_is_one_line(capsys, tmp_path):
    import os
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        line = _fails(capsys, ["plan", *_mlp_args(tmp_path), "--plan-out", str(folder / "plan.json")])
    finally:
        folder.chmod(0o700)
    assert "cannot write: Permission denied" in line


def test_control_characters_in_a_damaged_file_stay_on_one_line(capsys, tmp_path):
    p = _file(tmp_path, "bad.pbtxt", 'op { type: "Relu\\nX" input: "a" output: "b" }\n')
    line = _fails(capsys, ["inspect", p])
    assert "Relu\\nX" in line  # escaped, as two characters


@pytest.mark.parametrize("spec, words", [
    ("data=4,99:complex64", "not a Caffe2 tensor type"),
    ("data=4,99:U3", "not a Caffe2 tensor type"),
    ("data=1099511627776,1099511627776", "more than int64 can count"),
])
def test_inputs_no_caffe2_tensor_can_have(capsys, tmp_path, spec, words):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    assert words in _fails(capsys, ["inspect", net, "--input", spec])


def test_a_blob_past_int64_names_the_op_that_makes_it(capsys, tmp_path):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    init = _file(tmp_path, "init.pbtxt", FC_INIT.replace("ints: 10 ints: 99", "ints: 4294967296 ints: 99")
                 .replace("ints: 10 }", "ints: 4294967296 }"))
    line = _fails(capsys, ["inspect", net, "--init-net", init, "--input", "data=4294967296,99"])
    assert "blob 'fc' (made by op #0 FC -> 'fc')" in line and "more than int64 can count" in line


@pytest.mark.parametrize("text, words", [
    ('[1, [1, 2]]', "found a JSON list"),
    ('{"data": [1, [-4, 99]]}', "negative dimension"),
    ('{"data": [99, [4, 99]]}', "unknown TensorProto data type 99"),
    ('{"data": [1, [4.5, 99]]}', "with integers"),
    ('{"data": [1, [true, 99]]}', "with integers"),
    ('[' * 50000 + ']' * 50000, "nested too deeply"),
])
def test_a_bad_value_info_json_is_one_line(capsys, tmp_path, text, words):
    _file(tmp_path, "value_info.json", text)
    line = _fails(capsys, ["inspect", _file(tmp_path, "mlp.pbtxt", FC_NET)])
    assert "value_info.json" in line and words in line


def test_a_binary_string_that_is_not_utf8_names_the_op(capsys, tmp_path):
    from fuzz_cases import FC_NET as FC_RELU_NET, text_to_binary
    p = _file(tmp_path, "n.pb", text_to_binary(FC_RELU_NET).replace(b"Relu", b"R\xfflu"))
    line = _fails(capsys, ["inspect", p])
    assert "op #1: type b'R\\xfflu' is not UTF-8 text" in line


def test_an_init_net_fill_of_negative_shape_is_named(capsys, tmp_path):
    net = _file(tmp_path, "mlp.pbtxt", FC_NET)
    init = _file(tmp_path, "init.pbtxt", FC_INIT.replace("ints: 10 ints: 99", "ints: -10 ints: 99"))
    line = _fails(capsys, ["run", net, "--init-net", init, "--input", "data=4,99", "--quiet"])
    assert f"{init}: the init net's fill of 'fc_w': shape -10x99 has a negative dimension" in line


def test_machines_of_no_gpu_plan_and_machines_too_big_to_model_are_refused_first(capsys, tmp_path):
    """--gpus 0 is a CPU-only machine (every op on the CPU, no explanation asks for a second
    device); --gpus beyond the model's limit and a cluster of too many hosts are one line
    each, before any link is built (--gpus 100000 used to be killed for memory)."""
    import json
    from placer.examples import DATA
    net = str(DATA / "dlrm_small.pbtxt")
    assert main(["plan", net, "--gpus", "0", "--plan-out", str(tmp_path / "plan.json")]) == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["devices"] == ["cpu"] and {op["device"] for op in doc["ops"]} == {"cpu"}
    capsys.readouterr()
    assert main(["plan", net, "--gpus", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at most 256 GPUs" in err and "--cluster" in err
    cluster = tmp_path / "huge.json"
    cluster.write_text(json.dumps({"schema_version": 1, "kind": "cluster", "name": "huge",
                                   "hosts": {"count": 10**9, "machine": "2x-t4-pcie3"},
                                   "network": {"bytes_per_s": 12.5e9, "latency_s": 5e-6}}))
    assert main(["plan", net, "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hosts.count 1000000000" in err


def test_a_net_already_spread_by_collectives_is_refused_with_what_to_use(capsys, tmp_path):
    """placer shard -o writes a data-parallel train net (NCCLAllreduce, AllToAll over the
    GPUs): placer plan prices ops on one device each, so it says so in one line and names
    placer shard and placer run (it used to fail on an impossible colocation and blame
    --pin)."""
    out = tmp_path / "sharded"
    assert main(["shard", "--dlrm", "small", "--machine", "2x-t4-pcie3", "--global-batch", "256",
                 "--sharding-types", "table_wise,data_parallel", "--kernels", "hbm", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan", str(out / "train_net.pbtxt"), "--init-net", str(out / "train_init_net.pbtxt"),
                 "--machine", "2x-t4-pcie3", "--keep-existing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "through collectives" in err and "NCCLAllreduce" in err
    assert "placer shard" in err and "placer run --emulate-gpus" in err


@pytest.mark.parametrize("command, option, value, expected", [
    ("shard", "--host-mem", "12XB", "a size like 16GiB"),      # was reported against --gpu-mem
    ("shard", "--gpu-mem", "-1GB", "a size like 16GiB"),
    ("shard", "--gpu-reserve", "100%", "a percentage from 0% to below 100% (10%) or a fraction"),
    ("shard", "--uvm-cache-hit-rate", "1.5", "a number between 0 and 1"),
    ("shard", "--uvm-cache-ratio", "nan", "a number between 0 and 1"),
    ("shard", "--global-batch", "0", "an integer >= 1"),
    ("shard", "--search-time", "inf", "a number of seconds >= 0"),
    ("plan", "--gpu-mem", "16XB", "a size like 16GiB"),
    ("plan", "--gpus", "-1", "an integer >= 0"),
    ("plan", "--gpu-link-count", "0", "an integer >= 1"),
    ("plan", "--time-limit", "nan", "a number of seconds >= 0"),
    ("run", "--iterations", "0", "an integer >= 1"),
    ("run", "--warmup", "x", "an integer >= 0"),
    ("run", "--threads", "0", "an integer from 1 to 4096"),
    ("profile", "--threads", "9" * 20, "an integer from 1 to 4096"),      # a typing slip, not a thread count
    ("run", "--emulate-gpus", "0", "an integer >= 1"),
    ("run", "--max-restarts", "-1", "an integer >= 0"),
    ("run", "--seed", "9" * 5000, "an integer >= 0"),            # past Python's digit limit
    ("profile", "--repeats", "0", "an integer >= 1"),
    ("profile", "--budget", "-1", "a number of seconds >= 0"),
    ("train-net", "--lr", "0", "a positive number"),
    ("train-net", "--weight-decay", "-1e-4", "a number >= 0"),
    ("train-net", "--epsilon", "inf", "a positive number"),
])
def test_sizes_fractions_and_counts_are_refused_by_their_own_option(capsys, tmp_path, command, option, value,
                                                                     expected):
    """argparse converts the value (placer.arguments) and names the option it came with,
    before any file is read (the net named here does not exist)."""
    with pytest.raises(SystemExit) as refused:
        main([command, str(tmp_path / "absent.pbtxt"), f"{option}={value}"])  # = lets "-1" be a value
    lines = capsys.readouterr().err.splitlines()
    assert refused.value.code == 2 and len(lines) == 1, lines      # one line: no usage text above it
    last = lines[0]
    assert last.endswith(f"(see placer {command} --help)")
    assert last.startswith(f"placer {command}: error: argument {option}: expected {expected}"), last
    assert f"found '{value[:40]}" in last and len(last) < 300


def test_the_help_imports_no_command_and_a_command_only_its_own():
    """``placer --help`` lists every command from ``cli.COMMANDS`` without importing one
    (it starts in a fraction of a second); a command imports its own module only."""
    script = ("import contextlib, io, sys\n"
              "from placer import cli\n"
              "for argv in (['--help'], ['--debug', 'report', '--help']):\n"
              "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
              "        cli.main(argv)\n"
              "    print(sorted(m for m in sys.modules if m.startswith('placer.commands.')))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}).stdout
    assert out.splitlines() == ["[]", "['placer.commands.report']"]
