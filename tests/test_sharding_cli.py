"""`placer shard` end to end: the JSON's figures add up, the tables print, bad input ends
in one line with exit 2, -o writes a sharded net that loads."""
from __future__ import annotations

import json

import pytest

from placer import cli
from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import load_netdef, net_from_netdef
from placer.training.files import save_train_nets
from placer.training.recipe import OptimizerChoice, make_train_nets

TWO_V100 = ["--gpu-profile", "v100-16gb-sxm2", "--gpus", "2", "--gpu-link", "nvlink2"]
QUICK = ["--time-limit", "2", "--search-time", "0.5"]


def shard(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["shard", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def strict_json(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in the JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def small_doc():
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["shard", "--dlrm", "small", "--global-batch", "1024", *TWO_V100, *QUICK, "--json"])
    assert rc == 0
    return strict_json(buf.getvalue())


def test_the_json_adds_up(small_doc):
    doc = small_doc
    assert len(doc["tables"]) == 26
    assert [d["gpus"] for d in doc["degrees"]] == [1, 2]
    assert doc["global_batch"] == 1024 and doc["per_replica_batch"] * len(doc["gpus"]) == 1024
    assert sum(s["seconds"] for s in doc["critical_path"]) == pytest.approx(doc["step_s"], rel=1e-9)
    assert doc["samples_per_s"] == pytest.approx(1024 / doc["step_s"])
    for r in doc["ranks"]:
        assert r["capacity_bytes"] is None or r["memory_bytes"] <= r["capacity_bytes"]
    for t in doc["tables"]:
        assert t["lookup_s"] == pytest.approx(t["lookup_forward_s"] + t["lookup_backward_s"])
        assert sum(t["bytes_per_device"].values()) >= t["bytes"]    # rows and state, plus transient buffers
    per_sample = doc["step_s"] / doc["global_batch"]
    for b in doc["baselines"].values():
        if b["feasible"]:
            assert per_sample <= b["step_s"] / b["global_batch"] * (1 + 1e-12)
    best = min((d for d in doc["degrees"] if d["feasible"]), key=lambda d: d["step_s"] / d["global_batch"])
    assert best["gpus"] == len(doc["gpus"])


def test_the_tables_print(capsys):
    rc, out, err = shard(capsys, "--dlrm", "small", "--global-batch", "512", *TWO_V100, *QUICK)
    assert rc == 0, err
    for section in ("data-parallel degree", "tables:", "per device:", "critical path:", "baselines (placer's cost model):"):
        assert section in out
    assert "emb:::sls25_w" in out and "planned in" in out


def test_a_train_net_file_plans_at_its_own_batch(tmp_path, capsys):
    b = NetBuilder("toy")
    b.input("dense", (64, 3))
    b.input("idx", (128,), "int64")
    b.input("len", (64,), "int32")
    b.input("label", (64,), "int32")
    pooled = b.op("SparseLengthsSum", [b.param("emb", (5000, 8), "UniformFill", min=-0.1, max=0.1), "idx", "len"], "p")
    d = b.op("FC", ["dense", b.param("w", (8, 3)), b.param("bias", (8,), "ConstantFill", value=0.0)], "d")
    both = b.op("Concat", [pooled, d], ["both", "both_dims"], axis=1)
    top = b.op("FC", [both, b.param("tw", (2, 16)), b.param("tb", (2,), "ConstantFill", value=0.0)], "top")
    b.op("SoftmaxWithLoss", [top, "label"], ["softmax", "loss"])
    nets = make_train_nets(net_from_netdef(b.predict, b.init), ["loss"], OptimizerChoice("rowwise-adagrad", 0.1))
    save_train_nets(tmp_path, nets.train, nets.init)
    (tmp_path / "train_net.value_info.json").write_text(b.value_info_json())
    rc, out, err = shard(capsys, tmp_path / "train_net.pbtxt", "--init-net", tmp_path / "train_init_net.pbtxt",
                         *TWO_V100, *QUICK, "--json")
    assert rc == 0, err
    doc = strict_json(out)
    assert doc["global_batch"] == 64 and [t["table"] for t in doc["tables"]] == ["emb"]
    assert doc["tables"][0]["rows"] == 5000 and doc["tables"][0]["dim"] == 8


@pytest.mark.parametrize("argv,needle", [
    (["--dlrm", "small", "--global-batch", "512", *TWO_V100, "--degrees", "3"], "degree(s) [3]"),
    (["--dlrm", "small", "--global-batch", "512", *TWO_V100, "--kernels", "gpu"], "--kernels gpu"),
    (["--global-batch", "512", *TWO_V100], "give a train net"),
    (["--dlrm", "small", "--global-batch", "501", *TWO_V100, "--degrees", "2"], "split evenly"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    rc, out, err = shard(capsys, *argv)
    assert rc == 2
    assert err.startswith("placer: error:") and len(err.strip().splitlines()) == 1
    assert needle in err


def test_o_writes_the_sharded_net_and_refuses_layouts_it_cannot_write(tmp_path, capsys):
    out_dir = tmp_path / "sharded"
    rc, out, err = shard(capsys, "--dlrm", "small", "--global-batch", "256", *TWO_V100, *QUICK,
                         "--sharding-types", "table_wise,data_parallel", "--kernels", "hbm", "--degrees", "2",
                         "-o", out_dir)
    assert rc == 0, err
    train = load_netdef(out_dir / "train_net.pbtxt")
    types = [op.type for op in train.op]
    assert "AllToAll" in types and "NCCLAllreduce" in types
    shapes = json.loads((out_dir / "train_net.value_info.json").read_text())
    assert shapes["gpu_0/dense_in"][1] == [128, 13]      # each GPU its half of the dense rows
    owned = [b for b in shapes if b.endswith("_i")]
    assert owned and all(shapes[b][1] == [256] for b in owned)    # owners look up every sample
    rc, out, err = shard(capsys, "--dlrm", "small", "--global-batch", "256", *TWO_V100, *QUICK,
                         "--sharding-types", "row_wise", "--kernels", "hbm", "--degrees", "2", "-o", tmp_path / "rw")
    assert rc == 2 and "table-wise" in err and len(err.strip().splitlines()) == 1
