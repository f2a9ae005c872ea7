"""`placer shard` end to end: the JSON's figures add up, the tables print, bad input ends
in one line with exit 2, -o writes a sharded net of every layout that runs as the
one-device net (placer run prints the notes of what it could not write as planned)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer import cli
from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import load_netdef, net_from_netdef
from placer.runtime.executor import Executor
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


def test_o_writes_the_sharded_net(tmp_path, capsys):
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
    manifest = json.loads((out_dir / "sharding.json").read_text())
    assert {t["written"] for t in manifest["tables"].values()} <= {"table_wise", "data_parallel"}
    assert f"wrote {out_dir / 'sharding.json'}" in out


def toy_train_net(folder, rng, batch: int = 16):
    """Two tables (GivenTensorFill: a sharded net starts from the same values) read by
    SparseLengthsSum, a dense FC, concatenated, FC, SoftmaxWithLoss; written as a train net."""
    b = NetBuilder("toy")
    b.input("dense", (batch, 3))
    b.input("label", (batch,), "int32")
    def given(name, shape):
        values = (rng.standard_normal(int(np.prod(shape))) * 0.3).astype("float32")
        return b.param(name, shape, "GivenTensorFill", values=[float(v) for v in values])
    pooled = []
    for name, rows in (("a", 200), ("b", 120)):
        b.input(f"idx_{name}", (2 * batch,), "int64")
        b.input(f"len_{name}", (batch,), "int32")
        table = given(f"emb_{name}", (rows, 8))
        pooled.append(b.op("SparseLengthsSum", [table, f"idx_{name}", f"len_{name}"], f"p_{name}"))
    d = b.op("FC", ["dense", given("w", (8, 3)), b.param("bias", (8,), "ConstantFill", value=0.0)], "d")
    both = b.op("Concat", pooled + [d], ["both", "both_dims"], axis=1)
    top = b.op("FC", [both, given("tw", (2, 24)), b.param("tb", (2,), "ConstantFill", value=0.0)], "top")
    b.op("SoftmaxWithLoss", [top, "label"], ["softmax", "loss"])
    nets = make_train_nets(net_from_netdef(b.predict, b.init), ["loss"], OptimizerChoice("rowwise-adagrad", 0.1))
    save_train_nets(folder, nets.train, nets.init)
    (folder / "train_net.value_info.json").write_text(b.value_info_json())
    return nets


def toy_batch(rng, batch: int = 16) -> dict:
    feed = {"dense": rng.standard_normal((batch, 3)).astype("float32"),
            "label": rng.integers(0, 2, batch).astype("int32")}
    for name, rows in (("a", 200), ("b", 120)):
        feed[f"len_{name}"] = np.full(batch, 2, np.int32)
        feed[f"idx_{name}"] = rng.integers(0, rows, 2 * batch).astype(np.int64)
    return feed


@pytest.mark.parametrize("layouts,written", [
    (["--sharding-types", "row_wise,column_wise", "--kernels", "hbm"], {"row_wise", "column_wise"}),
    (["--sharding-types", "table_wise", "--kernels", "uvm"], {"host"}),
    (["--sharding-types", "table_wise", "--kernels", "host"], {"host"}),
])
def test_o_writes_every_layout_and_the_nets_run_as_the_one_device_net(tmp_path, capsys, layouts, written):
    rng = np.random.default_rng(0)
    src = tmp_path / "train"
    src.mkdir()
    nets = toy_train_net(src, rng)
    out_dir = tmp_path / "sharded"
    rc, out, err = shard(capsys, src / "train_net.pbtxt", "--init-net", src / "train_init_net.pbtxt", *TWO_V100,
                         *QUICK, *layouts, "--degrees", "2", "-o", out_dir)
    assert rc == 0, err
    manifest = json.loads((out_dir / "sharding.json").read_text())
    assert {t["written"] for t in manifest["tables"].values()} & written
    assert not {t["written"] for t in manifest["tables"].values()} - written
    uvm = [t for t, e in manifest["tables"].items() if "/uvm" in e["planned"]]
    assert all("Caffe2 has no unified memory" in manifest["tables"][t]["note"] for t in uvm)
    if uvm:     # one line for the tables of one note, naming them
        assert [n for n in manifest["notes"] if "unified memory" in n] == [
            f"{', '.join(uvm)}: {manifest['tables'][uvm[0]]['note']}"]
    assert all(f"placer: note: {n}" in out for n in manifest["notes"])

    feed = toy_batch(rng)
    nets.train.external_output[:] = ["loss"]
    one = Executor(net_from_netdef(nets.train, nets.init))
    want = float(one.run(feed, iterations=1, warmup=0)["loss"])
    sfeed = {}
    for one_blob, names in manifest["fed"].items():
        sfeed.update({name: feed[one_blob] for name in names})      # sharded lookups read the global batch
    for d in range(2):
        sfeed[f"gpu_{d}/dense"] = feed["dense"][d * 8:(d + 1) * 8]
        sfeed[f"gpu_{d}/label"] = feed["label"][d * 8:(d + 1) * 8]
    shapes = json.loads((out_dir / "train_net.value_info.json").read_text())
    assert sorted(shapes) == sorted(sfeed) and all(list(sfeed[b].shape) == shapes[b][1] for b in shapes)
    np.savez(tmp_path / "batch.npz", **sfeed)
    capsys.readouterr()
    rc = cli.main(["run", str(out_dir / "train_net.pbtxt"), "--init-net", str(out_dir / "train_init_net.pbtxt"),
                   "--emulate-gpus", "2", "--inputs",
                   str(tmp_path / "batch.npz"), "--iterations", "1", "--warmup", "0"])
    run_out, run_err = capsys.readouterr()
    assert rc == 0, run_err
    assert all(f"placer: note: {n}" in run_out for n in manifest["notes"])
    train = load_netdef(out_dir / "train_net.pbtxt")
    train.external_output[:] = ["gpu_0/loss", "gpu_1/loss"]
    got = Executor(net_from_netdef(train, load_netdef(out_dir / "train_init_net.pbtxt")), emulate_gpus=2).run(
        sfeed, iterations=1, warmup=0)
    # the per-GPU losses (each scaled by 1/2) add up to the one-device loss: float32 sums of
    # 16 samples in two halves, a few 1e-7 apart
    assert float(got["gpu_0/loss"]) + float(got["gpu_1/loss"]) == pytest.approx(want, rel=1e-5)


def test_o_refuses_a_row_wise_mean_lookup_in_one_line(tmp_path, capsys):
    b = NetBuilder("mean")
    b.input("idx", (32,), "int64")
    b.input("len", (16,), "int32")
    b.input("label", (16,), "int32")
    pooled = b.op("SparseLengthsMean", [b.param("emb", (400, 8), "UniformFill", min=-0.1, max=0.1), "idx", "len"],
                  "p")
    top = b.op("FC", [pooled, b.param("tw", (2, 8)), b.param("tb", (2,), "ConstantFill", value=0.0)], "top")
    b.op("SoftmaxWithLoss", [top, "label"], ["softmax", "loss"])
    nets = make_train_nets(net_from_netdef(b.predict, b.init), ["loss"], OptimizerChoice("rowwise-adagrad", 0.1))
    save_train_nets(tmp_path, nets.train, nets.init)
    (tmp_path / "train_net.value_info.json").write_text(b.value_info_json())
    rc, out, err = shard(capsys, tmp_path / "train_net.pbtxt", "--init-net", tmp_path / "train_init_net.pbtxt",
                         *TWO_V100, *QUICK, "--sharding-types", "row_wise", "--kernels", "hbm", "--degrees", "2",
                         "-o", tmp_path / "rw")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "row-wise SparseLengthsMean" in err and "emb" in err
