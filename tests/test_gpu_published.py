"""bench/gpu_published.py on a few DeepBench rows: the parsed shapes, the ratio, the dtype.

The rows come from ../shared/gpu-reference. conftest.py's ``corpus_dir()`` serves
../shared/nets only; its guard on ../shared also accepts a case parametrised on a path
under ../shared, so the ``reference`` fixture is parametrised on the folder where it
exists, and otherwise skips (fails under CI=true), as ``corpus_dir()`` does for the nets.
Expected predictions are the datasheet roofline worked by hand from the shipped
v100-16gb-sxm2 profile: 5 us per launch, 900 GB/s and FP32 15.7 / FP16 125 TFLOPS at the
fc family's default efficiencies (0.6, 0.6).
The whole-network tests (``--networks``) read bench/data/published_resnet50.csv, which
ships in the repository, and build ResNet-50 in code: they need no ../shared.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_published as gp  # noqa: E402

REFERENCE = ROOT.parent / "shared" / "gpu-reference"
SXM2_LAUNCH_S, SXM2_BW, FC_EFF = 5e-6, 900e9, 0.6


@pytest.fixture(params=[REFERENCE if REFERENCE.is_dir() else None], ids=["gpu-reference"])
def reference(request) -> Path:
    if request.param is None:
        if IN_CI:
            pytest.fail(f"CI=true but the GPU reference {REFERENCE} is missing")
        pytest.skip(f"GPU reference {REFERENCE} not found (it sits beside the checkout in CI)")
    return request.param


@pytest.fixture
def rows(reference):
    return gp.read_rows(reference)


def row(rows, file, source_row, precision, family):
    [hit] = [r for r in rows if (r.file, r.source_row, r.precision, r.family) == (file, source_row, precision, family)]
    return hit


def test_two_known_rows_parse_to_their_shapes(rows):
    g = row(rows, "deepbench_v100_train_gemm.csv", 5, "fp32", "gemm")
    assert g.dims == {"M": 1760, "N": 16, "K": 1760, "a_t": False, "b_t": False}
    assert (g.gpu, g.time_us) == ("NVIDIA V100", 38.0)
    c = row(rows, "deepbench_v100_train_conv.csv", 176, "fp32", "conv_fwd")
    assert c.dims == {"N": 4, "C": 1, "H": 161, "W": 700, "K": 32, "R": 5, "S": 20, "pad_h": 0, "pad_w": 0,
                      "stride_h": 2, "stride_w": 2, "out_h": 79, "out_w": 341}
    assert c.time_us == 78.0
    # an input layer: DeepBench has no backward_data time for it (README caveat)
    assert {r.family for r in rows if r.file == c.file and r.source_row == 176} == {"conv_fwd", "conv_bwd_filter"}


def test_ratio_is_predicted_over_published(rows):
    g = row(rows, "deepbench_v100_train_gemm.csv", 5, "fp32", "gemm")
    p = gp.Pricer(gp.GPU_PROFILES).price(g)
    # memory-bound: A, B and Y in float32 at 60% of 900 GB/s, plus one launch
    nbytes = 4 * (1760 * 1760 + 1760 * 16 + 1760 * 16)
    assert p.predicted_us == pytest.approx((SXM2_LAUNCH_S + nbytes / (SXM2_BW * FC_EFF)) * 1e6)
    assert p.ratio == pytest.approx(p.predicted_us / 38.0) and p.ratio == pytest.approx(0.7464, abs=1e-4)
    assert p.abs_error == pytest.approx(1 - p.ratio)
    assert (p.op, p.profile, p.source, p.bound) == ("MatMul", "v100-16gb-sxm2", "roofline", "memory")


def test_float16_row_is_priced_in_float16(rows):
    half = row(rows, "deepbench_v100_train_gemm.csv", 9, "fp16_mixed", "gemm")
    single = row(rows, "deepbench_v100_train_gemm.csv", 9, "fp32", "gemm")
    assert half.dims == single.dims == {"M": 1760, "N": 7000, "K": 1760, "a_t": False, "b_t": False}
    _, typed = gp.typed_one_op(gp.build_net(half, "float16")[0])
    assert [t.dtype for t in typed.op_inputs[0]] == ["float16", "float16"]
    pricer = gp.Pricer(gp.GPU_PROFILES)
    ph, ps = pricer.price(half), pricer.price(single)
    flops = 2 * 1760 * 7000 * 1760
    assert ph.dtype == "float16" and ph.bound == "compute"
    assert ph.predicted_us == pytest.approx((SXM2_LAUNCH_S + flops / (125e12 * FC_EFF)) * 1e6)
    assert ps.predicted_us == pytest.approx((SXM2_LAUNCH_S + flops / (15.7e12 * FC_EFF)) * 1e6)


def test_backward_rows_build_the_ops_that_make_dx_and_dw(rows):
    # dY (4, 32, 38, 166) back to X (4, 32, 79, 341): 341 = (166 - 1) * 2 + 10 + adj_w 1
    data = row(rows, "deepbench_v100_train_conv.csv", 180, "fp32", "conv_bwd_data")
    b, op_type = gp.build_net(data, "float32")
    _, typed = gp.typed_one_op(b)
    assert op_type == "ConvTranspose" and typed.op_outputs[0][0].shape == (4, 32, 79, 341)
    assert typed.op_inputs[0][0].shape == (4, 32, 38, 166)
    assert typed.features[0].macs == 4 * 32 * 38 * 166 * 32 * 5 * 10   # the forward's MACs
    filt = row(rows, "deepbench_v100_train_conv.csv", 176, "fp32", "conv_bwd_filter")
    b, op_type = gp.build_net(filt, "float32")
    _, typed = gp.typed_one_op(b)
    assert op_type == "ConvGradient" and [t.shape for t in typed.op_outputs[0]] == [(32, 1, 5, 20)]


def test_int8_and_p100_rows_are_not_priced(rows):
    pricer = gp.Pricer(gp.GPU_PROFILES)
    int8 = next(r for r in rows if r.precision == "int8")
    p100 = next(r for r in rows if r.gpu == "NVIDIA Tesla P100")
    assert pricer.price(int8).predicted_us is None and "int8" in pricer.price(int8).not_priced
    assert pricer.price(p100).not_priced == "no shipped profile for NVIDIA Tesla P100"


def test_missing_reference_exits_2(tmp_path, capsys):
    assert gp.main(["--reference", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err


# ------------------------------------------------------------------ whole networks (--networks)
# bench/data/published_resnet50.csv ships in the repository: these need no ../shared.

def test_published_resnet50_csv_parses_with_sources():
    rows = gp.read_network_rows()
    assert len(rows) == 20
    [v100] = [r for r in rows
              if (r.gpu, r.precision, r.mode, r.batch_per_gpu) == ("V100-16GB-SXM2", "FP32", "inference", 256)]
    assert (v100.gpus, v100.images_per_s) == (1, 1261.0)
    [a100] = [r for r in rows if (r.gpu, r.precision, r.mode, r.gpus) == ("A100-80GB-SXM4", "AMP", "training", 8)]
    assert (a100.batch_per_gpu, a100.images_per_s) == (256, 16621.0)
    for r in rows:
        assert "NVIDIA/DeepLearningExamples" in r.source and "README.md@" in r.source, r
        assert r.gpu in gp.NETWORK_PROFILES and r.precision in gp.NETWORK_DTYPES
        if r.mode == "training":
            assert "configs.yml@" in r.source   # where the per-GPU batch comes from


def test_resnet50_is_v15_and_priced_as_batch_over_step():
    net, fed = gp.network_net("inference", 1)
    typed = gp.infer(net, {n: gp.TensorType(tuple(s), d) for n, (d, s) in fed.items()})
    assert sum(op.type == "Conv" for op in net.ops) == 53
    assert sum(math.prod(t.shape) for t in net.params.values()) == 25_610_152   # with the BN statistics
    assert sum(f.macs for f, op in zip(typed.features, net.ops) if op.type in ("Conv", "FC")) == pytest.approx(
        4.11e9, rel=0.01)
    # v1.5: the stride-2 of a stage's first block is on its 3x3 conv, not the first 1x1
    strides = {op.outputs[0]: op.args.get("stride") for op in net.ops if op.type == "Conv"}
    assert (strides["res3_0_a"], strides["res3_0_b"]) == (1, 2)
    rows = [r for r in gp.read_network_rows() if r.mode == "training" and r.precision == "FP32"]
    pricer_models = {p: gp.CostModel(gp.load_device_profile(gp.DEFAULT_CPU_PROFILE, "cpu"),
                                     gp.load_device_profile(p, "gpu")) for p in set(gp.NETWORK_PROFILES.values())}
    cache: dict = {}
    one, eight = (gp.price_network(r, pricer_models, cache) for r in sorted(rows, key=lambda r: r.gpus))
    assert one.step_s == eight.step_s and one.unknown_ops == 0   # 8 GPUs: the one-GPU step, no all-reduce
    assert one.predicted_images_per_s == pytest.approx(112 / one.step_s)
    assert eight.predicted_images_per_s == pytest.approx(8 * 112 / one.step_s)
    assert one.ratio == pytest.approx(one.predicted_images_per_s / 367.0)
