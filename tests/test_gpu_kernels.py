"""The GPU kernel model (placer/costs/gpu_kernels.py, gpu_ops.py): waves, split-K, algorithm
choice, tensor-core alignment, and what CostModel says of a GPU op.

The hand-made model below has round constants, so each expectation is worked from the
formulas of the module docstring: an SM rate of 1e12 / 10 FLOP/s, no fixed cost, memory
so fast it never binds. The fit against DeepBench is checked in test_gpu_published.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from placer.costs import gpu_kernels as gk
from placer.costs.model import CostModel
from placer.hardware.profiles import load_device_profile
from placer.shapes import infer
from placer.formats.caffe2 import net_from_netdef
from placer.examples.builder import NetBuilder
from placer.types import TensorType

SM = 10
PEAK = 1e12


def model(knee=0.0, k_overhead=0.0, fixed_s=0.0, conv=None, bandwidth=1e18) -> gk.GpuKernelModel:
    params = gk.ClassParams(efficiency=1.0, k_overhead=k_overhead, knee=knee, fixed_s=fixed_s, conv=conv or {})
    return gk.GpuKernelModel(sm_count=SM, achieved_bandwidth_bytes_per_s=bandwidth,
                             peaks={"float32": PEAK, "float16": 8 * PEAK}, classes={"simt": params, "tensor": params})


def test_a_full_wave_and_one_tile_more_take_two_waves():
    g = model()
    k = 4096
    # 10 SMs x 128x128 tiles: M = 128 * 10 fills one wave exactly
    one, tile, split = gk.gemm_seconds(g, "float32", 1280, 128, k, max_split=1)
    per_tile = 2 * 128 * 128 * k / (PEAK / SM)
    assert float(one) == pytest.approx(per_tile, rel=1e-12)
    assert gk.TILES["simt"][int(tile)] == (128, 128) and int(split) == 1
    # one more row: the best the model finds is no better than a second wave's worth of the
    # extra work, and strictly slower than the full wave
    two = float(gk.gemm_seconds(g, "float32", 1281, 128, k, max_split=1)[0])
    assert one < two <= 2 * per_tile


def test_split_k_serves_a_skinny_product_with_a_long_k():
    g = model()
    m, n, k = 64, 64, 1 << 20
    unsplit = float(gk.gemm_seconds(g, "float32", m, n, k, max_split=1)[0])
    seconds, _, split = gk.gemm_seconds(g, "float32", m, n, k)
    assert int(split) > 1
    # 64x64 output: at most 4 blocks of 32x32 per SM... splitting K over the idle SMs
    # cuts the time by close to the split count
    assert float(seconds) < unsplit / 4


def test_the_knee_makes_small_tiles_feed_bound():
    fast = float(gk.gemm_seconds(model(knee=0.0), "float32", 32, 32, 1024, max_split=1)[0])
    fed = float(gk.gemm_seconds(model(knee=64.0), "float32", 32, 32, 1024, max_split=1)[0])
    # a 32x32 tile: max(32*32, 64 * 64) = 4096 multiply-adds' time per k step instead of 1024
    assert fed == pytest.approx(4 * fast, rel=1e-12)


def test_unaligned_tensor_products_pad_k_and_n_to_eight():
    g = model()
    aligned = float(gk.gemm_seconds(g, "float16", 4096, 64, 64, in_bytes=2, out_bytes=2, max_split=1)[0])
    padded = float(gk.gemm_seconds(g, "float16", 4096, 60, 60, in_bytes=2, out_bytes=2, max_split=1)[0])
    assert padded == pytest.approx(aligned, rel=1e-12)    # 60 -> 64: the same tiles, the same time
    slow = float(gk.gemm_seconds(g, "float16", 4096, 60, 60, in_bytes=2, out_bytes=2, max_split=1,
                                 unaligned_factor=0.5)[0])
    assert slow == pytest.approx(2 * aligned, rel=1e-12)


def conv(n=32, c=256, h=28, k=256, r=3, stride=1, pad=1, groups=1) -> gk.ConvShape:
    return gk.ConvShape(n=n, c=c, h=h, w=h, k=k, r=r, s=r, pad_h=pad, pad_w=pad, stride_h=stride,
                        stride_w=stride, groups=groups)


def test_winograd_is_offered_only_where_cudnn_has_it():
    g = model()
    assert "winograd" in gk.conv_algorithms(g, "float32", conv(), "forward", 4.0)
    assert "winograd" in gk.conv_algorithms(g, "float32", conv(r=5, pad=2), "forward", 4.0)
    for shape in (conv(stride=2), conv(r=7, pad=3), conv(groups=2)):
        assert "winograd" not in gk.conv_algorithms(g, "float32", shape, "forward", 4.0)
    assert "winograd" not in gk.conv_algorithms(g, "float16", conv(), "forward", 2.0)   # tensor cores: implicit GEMM
    # a 1x1 stride-1 forward is a GEMM; a depthwise conv runs the direct kernel only
    assert "gemm" in gk.conv_algorithms(g, "float32", conv(r=1, pad=0), "forward", 4.0)
    dw = gk.conv_algorithms(g, "float32", conv(c=64, k=64, groups=64), "forward", 4.0)
    assert math.isfinite(dw["depthwise"][0]) and not math.isfinite(dw["implicit_gemm"][0])


def test_winograd_wins_a_large_3x3_layer_by_its_reduced_multiplications():
    g = model()
    algos = gk.conv_algorithms(g, "float32", conv(n=64, c=256, h=56, k=256), "forward", 4.0)
    # 36 products per 16 outputs against 9 x 16: 4x fewer multiply-adds; transforms cost memory
    # only, and memory is free here, so Winograd is faster by close to 4x (tiles round up)
    ratio = algos["implicit_gemm"][0] / algos["winograd"][0]
    assert 3.0 < ratio < 4.5
    seconds, name = gk.conv_seconds(g, "float32", conv(n=64, c=256, h=56, k=256), "forward", 4.0)
    assert name == "winograd" and seconds == pytest.approx(float(algos["winograd"][0]))


def test_array_and_scalar_shapes_agree():
    g = model(knee=8.0, k_overhead=16.0, fixed_s=5e-6, bandwidth=800e9)
    shapes = [conv(), conv(r=1, pad=0), conv(stride=2), conv(c=3, k=64, h=224, r=7, stride=2, pad=3)]
    for p in gk.PASSES:
        many, names = gk.conv_seconds(g, "float32", gk.ConvShapes.of(shapes), p, 4.0)
        for i, s in enumerate(shapes):
            one, name = gk.conv_seconds(g, "float32", s, p, 4.0)
            assert one == pytest.approx(float(many[i]), rel=1e-12) and name == names[i]


def one_op(op_type, inputs, outputs, **args):
    b = NetBuilder("one")
    for name, (shape, dtype) in inputs.items():
        b.input(name, shape, dtype)
    b.output(b.op(op_type, list(inputs), outputs, **args))
    net = net_from_netdef(b.predict)
    typed = infer(net, {n: TensorType(tuple(s), d) for n, (d, s) in b.value_info.items()})
    return net.ops[0], list(typed.op_inputs[0]), typed.features[0]


@pytest.fixture(scope="module")
def v100():
    return CostModel(load_device_profile("host-ci-2core", "cpu"), load_device_profile("v100-16gb-sxm2", "gpu"))


def test_a_gpu_conv_is_priced_by_the_kernel_model_and_says_its_algorithm(v100):
    op, inputs, feats = one_op("Conv", {"X": ((32, 256, 28, 28), "float32"), "W": ((256, 256, 3, 3), "float32")},
                               "Y", kernel=3, pad=1)
    seconds, source = v100.op_time(op.type, inputs, op.args, feats, "gpu")
    assert source == "kernel-model"
    note = v100.op_kernel(op.type, inputs, op.args, feats, "gpu")
    assert note.startswith("cuDNN forward winograd") and "float32 on CUDA cores" in note
    # faster than the direct-convolution flops at the FP32 peak: Winograd's reduced work
    assert seconds < feats.flops / 15.7e12
    # the CPU side is untouched by the GPU model
    assert v100.op_time(op.type, inputs, op.args, feats, "cpu")[1] != "kernel-model"
    assert v100.op_kernel(op.type, inputs, op.args, feats, "cpu") == ""


def test_precision_picks_the_tensor_class_for_conv_and_gemm():
    host = load_device_profile("host-ci-2core", "cpu")
    a100 = load_device_profile("a100-40gb-sxm4", "gpu")
    op, inputs, feats = one_op("FC", {"X": ((256, 4096), "float32"), "W": ((4096, 4096), "float32"),
                                      "b": ((4096,), "float32")}, "Y")
    times = {}
    for mode in ("fp32", "tf32", "amp"):
        m = CostModel(host, a100, precision=mode)
        times[mode] = m.op_time(op.type, inputs, op.args, feats, "gpu")[0]
        assert ("TF32" in m.op_kernel(op.type, inputs, op.args, feats, "gpu")) == (mode == "tf32")
    # TF32's peak is 8x FP32's and float16's 2x TF32's on A100: each mode is faster
    assert times["fp32"] > 3 * times["tf32"] > 3 * times["amp"] * 1.0 / 2


def test_memory_bound_ops_run_at_the_achieved_bandwidth(v100):
    op, inputs, feats = one_op("Relu", {"X": ((64, 256, 56, 56), "float32")}, "Y")
    seconds, source = v100.op_time(op.type, inputs, op.args, feats, "gpu")
    prof = v100.profile("gpu")
    bw = prof.kernel_model["achieved_bandwidth_bytes_per_s"]
    nbytes = feats.bytes_read + feats.bytes_written
    assert source == "kernel-model"
    launches = seconds - nbytes / bw
    assert launches == pytest.approx(round(launches / prof.launch_overhead_s) * prof.launch_overhead_s, rel=1e-6)
    assert bw < prof.memory_bandwidth_bytes_per_s


def test_every_shipped_gpu_profile_has_a_sourced_kernel_model():
    from placer.hardware.profiles import shipped_profile_names
    gpus = []
    for name in shipped_profile_names():
        try:
            prof = load_device_profile(name, "gpu")
        except Exception:
            continue
        gpus.append(name)
        km = prof.kernel_model
        assert km and km["sm_count"] >= 40 and "simt" in km["classes"], name
        # tensor cores (a float16 peak) have their class; P100 has neither
        assert ("tensor" in km["classes"]) == ("float16" in prof.peak_flops), name
        assert km["source"] and km["classes_source"].startswith("fitted by bench/fit_gpu_kernels.py"), name
        assert km["achieved_bandwidth_bytes_per_s"] < prof.memory_bandwidth_bytes_per_s, name
        assert np.isfinite(list(prof.peak_flops.values())).all()
    assert len(gpus) >= 9


def test_the_plan_json_and_report_say_what_the_kernel_model_assumed(tmp_path, capsys):
    import json
    from placer import cli
    from placer.examples import __file__ as examples_init
    from pathlib import Path
    net = Path(examples_init).parent / "data" / "resnet_small.pbtxt"
    out = tmp_path / "plan.json"
    assert cli.main(["plan", str(net), "--gpu-profile", "a100-40gb-sxm4", "--precision", "tf32",
                     "--stability-draws", "0", "--plan-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["precision"] == "tf32"
    convs = [o for o in doc["ops"] if o["type"] == "Conv"]
    assert convs and all(o["source"]["cuda:0"] == "kernel-model" for o in convs)
    assert all(o["gpu_kernel"].startswith("cuDNN forward ") and "TF32 tensor cores" in o["gpu_kernel"]
               for o in convs)
    relu = next(o for o in doc["ops"] if o["type"] == "Relu")
    assert relu["gpu_kernel"].startswith("memory-bound")
    html = tmp_path / "r.html"
    assert cli.main(["report", str(out), "-o", str(html)]) == 0
    assert "GPU: cuDNN forward" in html.read_text()


def test_a_gpu_without_the_asked_math_says_what_it_was_priced_in(tmp_path, capsys):
    import json
    from placer import cli
    from placer.examples import __file__ as examples_init
    from pathlib import Path
    net = Path(examples_init).parent / "data" / "resnet_small.pbtxt"
    out = tmp_path / "plan.json"
    assert cli.main(["plan", str(net), "--precision", "tf32", "--stability-draws", "0", "--plan-out", str(out)]) == 0
    text = capsys.readouterr().out
    note = "NVIDIA V100 PCIe 16 GB has no tf32 peak: its conv and GEMM work is priced in float32"
    assert note in text
    doc = json.loads(out.read_text())
    assert doc["precision"] == "tf32" and doc["precision_notes"] == [note]
    conv = next(o for o in doc["ops"] if o["type"] == "Conv")
    assert "float32 on CUDA cores" in conv["gpu_kernel"]
    html = tmp_path / "r.html"
    assert cli.main(["report", str(out), "-o", str(html)]) == 0
    assert note in html.read_text()


def test_the_plan_keeps_one_note_per_op_unless_gpus_differ():
    from placer.planning.view import gpu_kernel_field
    devices = ["cpu", "cuda:0", "cuda:1", "cuda:2"]
    same = {1: "cuDNN forward winograd (float32 on CUDA cores)", 2: "cuDNN forward winograd (float32 on CUDA cores)"}
    assert gpu_kernel_field(same, devices) == "cuDNN forward winograd (float32 on CUDA cores)"
    mixed = {3: "cuDNN forward implicit gemm (TF32 tensor cores)", 1: "cuDNN forward winograd (float32 on CUDA cores)"}
    assert gpu_kernel_field(mixed, devices) == {"cuda:0": "cuDNN forward winograd (float32 on CUDA cores)",
                                                "cuda:2": "cuDNN forward implicit gemm (TF32 tensor cores)"}
