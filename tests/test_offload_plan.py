"""The planner finds the ZeRO-Offload layout on its own where GPU memory binds.

A wide MLP (four 2048 x 2048 FC layers at batch 2048: 17 GFLOP a layer, ~8 ms on the
EPYC host against ~0.3 ms on the V100, so the FCs belong on the GPU) trained with Adam in
amp-fp16 needs, all on the GPU, 2 bytes a parameter for the half weights, 2 for their
gradients, 4 for the float32 master and 8 for Adam's two moments, 16, plus its
activations: 19 bytes a parameter in all here. The ZeRO-Offload layout (Ren et al.,
USENIX ATC 2021) keeps the half weights, the gradients being made and the activations on
the GPU (7 bytes a parameter here) and the masters, the moments and the update on the
host. With the GPU's memory between the two, the plan must put every update of a half
parameter's master on the CPU, keep the FC compute on the GPU, fit, and name the layout
in its notes; with more memory it keeps some updates on the GPU (a mix per layer).
(At batch 16 the same budgets make whole layers go to the host instead: a 134 MFLOP FC
costs less there than copying its weights, and the plan does that.)
"""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from placer.cli import main
from placer.examples.builder import NetBuilder

WIDTH, LAYERS, BATCH = 2048, 4, 2048


def _mlp(folder):
    b = NetBuilder("wide_mlp")
    x = b.input("data", (BATCH, WIDTH))
    b.input("label", (BATCH,), "int32")
    for i in range(LAYERS):
        w = b.param(f"fc{i}_w", (WIDTH, WIDTH), "GaussianFill", mean=0.0, std=0.02)
        bias = b.param(f"fc{i}_b", (WIDTH,), "ConstantFill", value=0.0)
        x = b.op("FC", [x, w, bias], f"fc{i}")
        if i < LAYERS - 1:
            x = b.op("Relu", [x], f"relu{i}")
    b.op("SoftmaxWithLoss", [x, "label"], ["softmax", "loss"])
    return b.save(folder, "wide_mlp")


def _cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def train_net(tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    files = _mlp(folder)
    code, text = _cli(["train-net", str(files["predict"]), "--loss", "loss", "--optimizer", "adam",
                       "--lr", "1e-3", "--precision", "amp-fp16", "--update-order", "interleaved",
                       "-o", str(folder / "train")])
    assert code == 0, text
    return folder / "train"


def _plan(train, *extra):
    code, text = _cli(["plan", str(train / "train_net.pbtxt"), "--init-net", str(train / "train_init_net.pbtxt"),
                       "--input", f"data={BATCH},{WIDTH}", "--input", f"label={BATCH}:int32",
                       "--cpu-profile", "epyc-7742-2s", "--gpu-profile", "v100-16gb-sxm2",
                       "--json", "--stability-draws", "0", *extra])
    assert code == 0, text
    return json.loads(text)


def test_with_room_for_everything_the_updates_stay_on_the_gpu(train_net):
    doc = _plan(train_net)
    updates = [o for o in doc["ops"] if o["type"] == "Adam" and o["outputs"][0].endswith("_w_fp32")]
    assert len(updates) == LAYERS and all(o["device"] == "cuda:0" for o in updates)
    assert not any(n.startswith("ZeRO-Offload") for n in doc["notes"])


def _weight_updates(doc):
    return [o for o in doc["ops"] if o["type"] == "Adam" and o["outputs"][0].endswith("_w_fp32")]


def test_when_gpu_memory_binds_the_plan_offloads_masters_state_and_updates(train_net):
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    # 19 bytes a parameter do not fit; the offload layout's 7 do (8 bytes a parameter of
    # GPU memory, 7.2 usable after the 10% reserve)
    doc = _plan(train_net, "--gpu-mem", str(8 * params))
    assert not doc["baselines"]["all_gpu"]["feasible"]
    updates = _weight_updates(doc)
    assert len(updates) == LAYERS and all(o["device"] == "cpu" for o in updates)
    fcs = [o for o in doc["ops"] if o["type"] in ("FC", "FCGradient")]
    assert all(o["device"] == "cuda:0" for o in fcs)
    gpu = doc["memory"]["cuda:0"]
    assert gpu["used_bytes"] <= gpu["usable_bytes"]
    assert doc["optimal"], doc["optimality"]    # the MILP proved it within the memory limits
    # the masters and both moments (12 bytes a weight) live on the host
    assert doc["memory"]["cpu"]["param_bytes"] >= 12 * LAYERS * WIDTH * WIDTH
    note = next(n for n in doc["notes"] if n.startswith("ZeRO-Offload layout"))
    assert f"{LAYERS} of {LAYERS}" in note or f"of {2 * LAYERS}" in note


def test_with_memory_for_part_of_the_state_the_plan_offloads_part(train_net):
    """12 bytes a parameter (10.8 usable): the master and moments of a layer fit beside the
    half weights, and the plan keeps that update on the GPU (a mix per layer)."""
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    doc = _plan(train_net, "--gpu-mem", str(12 * params))
    assert not doc["baselines"]["all_gpu"]["feasible"]
    on_cpu = [o for o in _weight_updates(doc) if o["device"] == "cpu"]
    assert 0 < len(on_cpu) < LAYERS
    gpu = doc["memory"]["cuda:0"]
    assert gpu["used_bytes"] <= gpu["usable_bytes"]
    full = _plan(train_net, "--gpu-mem", str(8 * params))
    assert doc["total_s"] < full["total_s"]      # each update kept on the GPU saves its copies
