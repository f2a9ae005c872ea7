"""bench/gpu_published.py on a few DeepBench rows: the parsed shapes, the ratio, the dtype.

The rows come from ../shared/gpu-reference. conftest.py's ``corpus_dir()`` serves
../shared/nets only; its guard on ../shared also accepts a case parametrised on a path
under ../shared, so the ``reference`` fixture is parametrised on the folder where it
exists, and otherwise skips (fails under CI=true), as ``corpus_dir()`` does for the nets.
Expected predictions are the GPU kernel model's (placer/costs/gpu_kernels.py) on the
constants stored in the shipped v100-16gb-sxm2 profile, computed directly from the model's
GEMM function: the bench's one-op nets must reach the same figure through CostModel.
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

from placer.costs import gpu_kernels as gk  # noqa: E402

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


def _v100_kernel_model():
    prof = gp.load_device_profile("v100-16gb-sxm2", "gpu")
    return gk.from_document(prof.kernel_model, prof.peak_flops)


def test_ratio_is_predicted_over_published(rows):
    g = row(rows, "deepbench_v100_train_gemm.csv", 5, "fp32", "gemm")
    p = gp.Pricer(gp.GPU_PROFILES).price(g)
    # the kernel model's GEMM on the profile's constants: a MatMul is that one GEMM
    want = float(gk.gemm_seconds(_v100_kernel_model(), "float32", 1760, 16, 1760, in_bytes=4, out_bytes=4)[0])
    assert p.predicted_us == pytest.approx(want * 1e6, rel=1e-12)
    assert p.ratio == pytest.approx(p.predicted_us / 38.0) and p.abs_error == pytest.approx(abs(p.ratio - 1))
    assert (p.op, p.profile, p.source) == ("MatMul", "v100-16gb-sxm2", "kernel-model")
    assert p.bound == "cuBLAS GEMM x1 (float32 on CUDA cores)"


def test_float16_row_is_priced_in_float16(rows):
    half = row(rows, "deepbench_v100_train_gemm.csv", 9, "fp16_mixed", "gemm")
    single = row(rows, "deepbench_v100_train_gemm.csv", 9, "fp32", "gemm")
    assert half.dims == single.dims == {"M": 1760, "N": 7000, "K": 1760, "a_t": False, "b_t": False}
    _, typed = gp.typed_one_op(gp.build_net(half, "float16")[0])
    assert [t.dtype for t in typed.op_inputs[0]] == ["float16", "float16"]
    pricer = gp.Pricer(gp.GPU_PROFILES)
    ph, ps = pricer.price(half), pricer.price(single)
    g = _v100_kernel_model()
    assert ph.dtype == "float16" and "float16 tensor cores" in ph.bound
    assert ph.predicted_us == pytest.approx(
        float(gk.gemm_seconds(g, "float16", 1760, 7000, 1760, in_bytes=2, out_bytes=2)[0]) * 1e6, rel=1e-12)
    assert ps.predicted_us == pytest.approx(
        float(gk.gemm_seconds(g, "float32", 1760, 7000, 1760, in_bytes=4, out_bytes=4)[0]) * 1e6, rel=1e-12)
    # a large GEMM: tensor cores at their share of 125 TFLOPS against CUDA cores' of 15.7
    assert 4 < ps.predicted_us / ph.predicted_us < 8


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


def test_int8_and_p100_rows_are_priced(rows):
    pricer = gp.Pricer(gp.GPU_PROFILES)
    int8 = next(r for r in rows if r.precision == "int8")
    priced = pricer.price(int8)
    assert priced.dtype == "int8" and priced.predicted_us > 0 and "int8 tensor cores" in priced.bound
    # P100 has no tensor cores: its pseudo-fp16 rows (fp16 operands, fp32 math) run on CUDA cores
    p100 = next(r for r in rows if r.gpu == "NVIDIA Tesla P100" and r.precision == "fp16_pseudo")
    priced = pricer.price(p100)
    assert priced.profile == "p100-16gb-pcie3" and "float32 on CUDA cores" in priced.bound
    assert not [r for r in gp.price_all(rows, gp.GPU_PROFILES) if r.not_priced]


def test_the_stored_kernel_constants_are_a_current_fit(reference, capsys):
    """bench/fit_gpu_kernels.py --check refits on the rows: the constants in the shipped
    profiles must describe them as well as the refit does (within a point of median |error|)."""
    import fit_gpu_kernels
    assert fit_gpu_kernels.main(["--reference", str(reference), "--check"]) == 0
    assert "stale" not in capsys.readouterr().out


def test_the_kernel_model_meets_its_medians_on_deepbench(reference):
    """Median |error| per (GPU, kernel family, precision) on every priced row, as the
    bench prints it: at most 25% for GEMM and convolution in every precision given."""
    results = gp.price_all(gp.read_rows(reference), gp.GPU_PROFILES)
    summary = gp.summarize(results)
    for s in summary:
        if s["gpu"] == "NVIDIA Tesla P100":
            continue     # not fitted: the carried check below
        assert s["median_abs_error"] <= 0.25, s
    # P100 carries V100's SIMT constants at its own SMs, peak and bandwidth (none of its rows
    # is fitted): its fp32 kernels within a median 30%
    p100 = [s for s in summary if s["gpu"] == "NVIDIA Tesla P100" and s["precision"] == "fp32"]
    assert len(p100) == 4 and all(s["median_abs_error"] <= 0.30 for s in p100), p100


def test_the_modelled_forward_algorithm_is_mostly_cudnns(reference):
    """DeepBench records the forward algorithm cuDNN's heuristics chose; the model's choice
    (the fastest of its algorithms) agrees on at least 90% of each group's rows."""
    results = gp.price_all(gp.read_rows(reference), gp.GPU_PROFILES)
    agreement = gp.algorithm_agreement(results)
    assert len(agreement) == 6
    for gpu, prec, agree, n, misses in agreement:
        assert n == 94 and agree >= 0.9 * n, (gpu, prec, misses)


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
        assert r.gpu in gp.NETWORK_PROFILES and r.precision in gp.NETWORK_PRECISIONS
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
    pricer_models = {(p, "fp32"): gp.CostModel(gp.load_device_profile(gp.DEFAULT_CPU_PROFILE, "cpu"),
                                               gp.load_device_profile(p, "gpu"), precision="fp32")
                     for p in set(gp.NETWORK_PROFILES.values())}
    cache: dict = {}
    one, eight = (gp.price_network(r, pricer_models, cache) for r in sorted(rows, key=lambda r: r.gpus))
    assert one.step_s == eight.step_s and one.unknown_ops == 0   # 8 GPUs: the one-GPU step, no all-reduce
    assert one.predicted_images_per_s == pytest.approx(112 / one.step_s)
    assert eight.predicted_images_per_s == pytest.approx(8 * 112 / one.step_s)
    assert one.ratio == pytest.approx(one.predicted_images_per_s / 367.0)


def test_published_networks_at_batch_32_and_more_are_within_the_targets():
    """The whole-network check: no constant is fitted to these rows (the kernel constants
    come from DeepBench), and every group at batch >= 32 is within a median factor of 1.2
    and a worst of 1.5 of the published throughput."""
    rows = gp.read_network_rows() + gp.read_network_rows(gp.TF_BENCHMARKS_CSV)
    host = gp.load_device_profile(gp.DEFAULT_CPU_PROFILE, "cpu")
    models = {(p, m): gp.CostModel(host, gp.load_device_profile(p, "gpu"), precision=m)
              for p in set(gp.NETWORK_PROFILES.values()) for m in set(gp.NETWORK_PRECISIONS.values())}
    cache: dict = {}
    results = [gp.price_network(r, models, cache) for r in rows]
    summary = {g: (n, med, worst) for g, n, med, worst in gp.network_summary(results)}
    independent = "independent: tf_cnn_benchmarks P100 FP32 training"
    assert set(summary) == {"inference FP32 batch>=32", "training FP32", "TF32", "AMP", "batch 1", independent}
    for group, (n, med, worst) in summary.items():
        if group != "batch 1":
            assert med <= 1.2 and worst <= 1.5, (group, med, worst)
    assert summary[independent][0] == 6


def test_the_independent_nets_are_built_as_published():
    """tf_cnn_benchmarks' 2017 nets: ResNet v1 (stride on the first 1x1), ResNet-152's
    (3, 8, 36, 3) blocks, VGG16's 13 convs and 3 FCs; parameter counts as published
    (25.6 M with BN statistics, 60.3 M for ResNet-152 with them, 138.4 M for VGG16)."""
    for model, convs, params in (("resnet50_v1", 53, 25.6e6), ("resnet152_v1", 155, 60.4e6), ("vgg16", 13, 138.4e6)):
        net, _ = gp.network_net("inference", 1, model)
        assert sum(op.type == "Conv" for op in net.ops) == convs, model
        assert sum(math.prod(t.shape) for t in net.params.values()) == pytest.approx(params, rel=0.01), model
    net, _ = gp.network_net("inference", 1, "resnet50_v1")
    strides = {op.outputs[0]: op.args.get("stride") for op in net.ops if op.type == "Conv"}
    assert (strides["res3_0_a"], strides["res3_0_b"]) == (2, 1)
