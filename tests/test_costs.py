"""The cost model: order of trust, family fits, copy curves, and annotate on a small net."""
from __future__ import annotations

import math

import numpy as np
import pytest

from placer.hardware.constants import DEFAULT_MEMORY_EFFICIENCY, default_efficiency
from placer.costs.model import (OP_COLUMNS, CostModel, annotate, curve_time, family_of, fit_family,
                          gemm_dims, row_efficiency)
from placer.hardware.profiles import default_profiles, load_device_profile
from placer.hardware.device_profile import DeviceProfile, LinkCurve, OpTiming
from placer.shapes import infer
from placer.types import Args, Net, Op, OpFeatures, TensorType

PEAK, BW = 1e11, 1e10


def _cpu(ops=()) -> DeviceProfile:
    return DeviceProfile(kind="cpu", name="synthetic", source={"kind": "measured", "host": "x", "date": "d"},
                         peak_flops={"float32": PEAK}, memory_bandwidth_bytes_per_s=BW,
                         memory_capacity_bytes=8e9, launch_overhead_s=2e-6,
                         ops={t.key: t for t in ops})


def _truth(flops, nbytes, o=30e-6, ec=0.4, em=0.7):
    return o + max(flops / (PEAK * ec), nbytes / (BW * em))


def _fc_point(m, k, n, time_s=None) -> OpTiming:
    flops, nbytes = 2.0 * m * k * n, 4.0 * (m * k + k * n + n + m * n)
    types = (TensorType((m, k)), TensorType((n, k)), TensorType((n,)))
    return OpTiming("FC", types, {}, 10, time_s if time_s is not None else _truth(flops, nbytes),
                    0.0, flops, nbytes)


def test_fit_recovers_known_efficiencies():
    rng = np.random.default_rng(1)
    points = []
    for i in range(30):  # a mix of compute-bound and memory-bound points
        flops = 10 ** rng.uniform(4, 10)
        nbytes = 10 ** rng.uniform(3, 8)
        points.append(OpTiming("FC", (TensorType((i + 1, 1)),), {}, 5, _truth(flops, nbytes), 0.0, flops, nbytes))
    fit = fit_family(points, PEAK, BW, 2e-6, "fc")
    assert fit.points == 30
    assert fit.compute_efficiency == pytest.approx(0.4, rel=0.02)
    assert fit.memory_efficiency == pytest.approx(0.7, rel=0.02)
    assert fit.overhead_s == pytest.approx(30e-6, rel=0.05)
    assert fit.median_abs_pct_error < 1.0


def test_fit_with_one_point_matches_it():
    p = _fc_point(64, 512, 512)
    fit = fit_family([p], PEAK, BW, 2e-6, "fc")
    pred = fit.overhead_s + max(p.flops / (PEAK * fit.compute_efficiency), p.bytes / (BW * fit.memory_efficiency))
    assert pred == pytest.approx(p.median_s, rel=0.02)


def test_order_of_trust_measured_fitted_roofline_unknown():
    train = [_fc_point(m, k, n) for m, k, n in [(8, 256, 256), (64, 1024, 512), (1, 4096, 4096),
                                                 (256, 512, 1024), (16, 128, 64)]]
    odd = _fc_point(32, 64, 64, time_s=0.5)  # a measured entry far from the fit: measured must win
    model = CostModel(_cpu(train + [odd]), default_profiles()[1], unknown_op_cost_s=1e-3)
    feats = OpFeatures(flops=odd.flops, bytes_read=odd.bytes, bytes_written=0.0)
    assert model.op_time("FC", odd.inputs, {}, feats, "cpu") == (0.5, "measured")

    new = _fc_point(128, 2048, 1024)
    t, src = model.op_time("FC", new.inputs, {}, OpFeatures(flops=new.flops, bytes_read=new.bytes), "cpu")
    assert src == "fitted"
    assert t == pytest.approx(new.median_s, rel=0.05)  # the fit ignores the outlier mostly

    blind = CostModel(_cpu(train + [odd]), default_profiles()[1], use_measured=False)
    assert blind.op_time("FC", odd.inputs, {}, feats, "cpu")[1] == "fitted"

    conv_in = (TensorType((1, 3, 8, 8)), TensorType((4, 3, 3, 3)))
    cf = OpFeatures(flops=2e6, bytes_read=1e5, bytes_written=1e4)
    t, src = model.op_time("Conv", conv_in, {"kernel": 3}, cf, "cpu")
    assert src == "roofline"
    eff_c, eff_m = default_efficiency("conv", "cpu")
    assert t == pytest.approx(2e-6 + max(2e6 / (PEAK * eff_c), 1.1e5 / (BW * eff_m)))
    assert model.op_time("NoSuchOp", conv_in, {}, OpFeatures(known=False), "cpu") == (1e-3, "unknown")
    report = model.fit_report("cpu")
    assert list(report.group) == ["fc", "type:FC"] and list(report.points) == [6, 6]


def test_copy_curve_interpolates_then_extrapolates_the_line():
    curve = LinkCurve(latency_s=1e-5, bytes_per_s=1e10, points=[(1000, 1e-5), (1_000_000, 1e-4)])
    assert curve_time(curve, 1000) == pytest.approx(1e-5)
    assert curve_time(curve, math.sqrt(1000 * 1_000_000)) == pytest.approx(math.sqrt(1e-5 * 1e-4))
    assert curve_time(curve, 1e9) == pytest.approx(1e-5 + 1e9 / 1e10)
    gpu = load_device_profile("a100-40gb-pcie4", "gpu")
    model = CostModel(_cpu(), gpu)
    assert model.copy_time(0, "h2d") == 0.0
    assert model.copy_time(2 ** 30, "h2d") == pytest.approx(1e-5 + 2 ** 30 / 25e9)
    assert model.copy_time(2 ** 30, "d2h", pinned=False) == pytest.approx(1e-5 + 2 ** 30 / 12.5e9)
    assert gpu.memory_capacity_bytes == 40 * 2 ** 30


def test_families():
    assert family_of("Conv") == "conv"
    assert family_of("FC") == family_of("MatMul") == "fc"
    assert family_of("Relu") == "elementwise"
    assert family_of("NoSuchOp") == "other"
    assert family_of("Alias") == "view"
    # their kernels copy (Caffe2's outputs never alias their inputs): priced by their bytes
    for op_type in ("Reshape", "Flatten", "FlattenToVec", "Squeeze", "ExpandDims"):
        assert family_of(op_type) == "movement", op_type


def _datasheet_gpu():
    """The default GPU profile without its kernel model: the datasheet roofline prices it
    (as any user profile without a ``kernel_model``)."""
    gpu = default_profiles()[1]
    gpu.kernel_model = None
    return gpu


def test_reshape_like_ops_pay_for_the_copy_their_kernels_make():
    model = CostModel(_cpu(), _datasheet_gpu())
    big = OpFeatures(bytes_read=1e9, bytes_written=1e9)  # a 1 GB Flatten copies 1 GB
    t, src = model.op_time("Flatten", (TensorType((1000, 250000)),), {}, big, "gpu")
    eff_m = DEFAULT_MEMORY_EFFICIENCY["movement"]
    assert src == "roofline" and t == pytest.approx(5e-6 + 2e9 / (900e9 * eff_m))
    copy_like, _ = model.op_time("Copy", (TensorType((1000, 250000)),), {}, big, "gpu")
    assert copy_like == pytest.approx(t)
    cpu_t, _ = model.op_time("Flatten", (TensorType((1000, 250000)),), {}, big, "cpu")
    assert cpu_t == pytest.approx(2e-6 + 2e9 / (BW * default_efficiency("movement", "cpu")[1]))


def test_an_alias_launches_nothing_on_the_gpu_and_costs_a_call_on_the_host():
    model = CostModel(_cpu(), default_profiles()[1])   # the kernel model leaves views to the roofline
    x = (TensorType((1000, 250000)),)
    assert model.op_time("Alias", x, {}, OpFeatures(), "gpu") == (0.0, "roofline")
    assert model.op_time("Alias", x, {}, OpFeatures(), "cpu") == (2e-6, "roofline")


@pytest.mark.parametrize("op_type,args,inputs,launches", [
    ("Relu", {}, [(8, 16)], 1),
    ("Sigmoid", {}, [(8, 16)], 5),
    ("SpatialBN", {"is_test": 1}, [(2, 4, 8, 8), (4,), (4,), (4,), (4,)], 8),
    ("Conv", {"kernel": 3, "pad": 1}, [(2, 64, 8, 8), (64, 64, 3, 3), (64,)], 20),
    ("Conv", {"kernel": 1}, [(2, 64, 8, 8), (64, 64, 1, 1), (64,)], 2),
    ("SparseLengthsSum", {}, [(1000, 16), (64,), (8,)], 11),
])
def test_gpu_roofline_pays_one_launch_overhead_per_kernel_launch(op_type, args, inputs, launches):
    """Tiny ops: the GPU time is launches x the profile's launch overhead (5 us on the
    shipped profiles), the host time one call; the counts are the registry's, held to
    what the kernels launch by the stand-in tests (tests/test_ops_gpu_rules.py)."""
    gpu = _datasheet_gpu()
    model = CostModel(_cpu(), gpu)
    dtypes = {"SparseLengthsSum": ["float32", "int64", "int32"]}.get(op_type, ["float32"] * len(inputs))
    types = tuple(TensorType(s, d) for s, d in zip(inputs, dtypes))
    tiny = OpFeatures(flops=1.0, bytes_read=4.0, bytes_written=4.0)
    t, src = model.op_time(op_type, types, Args(args), tiny, "gpu")
    assert src == "roofline" and t == pytest.approx(launches * gpu.launch_overhead_s, rel=1e-3)
    assert model.op_time(op_type, types, Args(args), tiny, "cpu")[0] == pytest.approx(2e-6, rel=1e-2)


def _small_net() -> Net:
    def op(i, t, ins, outs, **args):
        return Op(i, t, tuple(ins), tuple(outs), Args(args, op=f"#{i} {t}"), name=f"op{i}")
    ops = [op(0, "FC", ["data", "w1", "b1"], ["h"]), op(1, "Relu", ["h"], ["h"]),
           op(2, "FC", ["h", "w2", "b2"], ["y"]), op(3, "Softmax", ["y"], ["p"]),
           op(4, "MysteryOp", ["p"], ["q"])]
    params = {"w1": TensorType((16, 8)), "b1": TensorType((16,)),
              "w2": TensorType((10, 16)), "b2": TensorType((10,))}
    return Net("small", ops, ["data", *params], ["p", "q"], params=params)


def test_annotate_small_net():
    from placer.hardware.machine import compose_machine
    typed = infer(_small_net(), {"data": TensorType((4, 8))})
    cpu, gpu = default_profiles()
    fc1 = OpTiming("FC", (TensorType((4, 8)), TensorType((16, 8)), TensorType((16,))), {}, 9, 3.5e-5, 1e-6)
    cpu.ops = {fc1.key: fc1}
    machine = compose_machine(cpu, gpu, gpus=2)
    costs = annotate(typed, machine, unknown_op_cost_s=2e-3)
    ops, t = costs.ops, costs.tensors
    assert list(ops.columns) == OP_COLUMNS and list(ops["index"]) == [0, 1, 2, 3, 4]
    assert list(ops["type"]) == ["FC", "Relu", "FC", "Softmax", "MysteryOp"]
    assert costs.op_s.shape == (5, 3)
    assert costs.op_s[0, 0] == 3.5e-5 and costs.op_source[0, 0] == "measured"
    assert costs.op_source[2, 0] == "fitted"          # FC family fitted from the one entry
    assert costs.op_source[1, 0] == "roofline"        # no elementwise entries on the host
    relu = ops.loc[1]
    # the GPU's kernel model: one launch, the bytes at the achieved (STREAM-measured) bandwidth
    assert costs.op_source[1, 1] == "kernel-model"
    achieved = gpu.kernel_model["achieved_bandwidth_bytes_per_s"]
    assert costs.op_s[1, 1] == pytest.approx(5e-6 + (relu.bytes_read + relu.bytes_written) / achieved)
    assert (costs.op_s[:, 1] == costs.op_s[:, 2]).all()   # two GPUs of one profile: priced once, the same
    assert ops.loc[0, "output_bytes"] == 4 * 16 * 4
    assert ops.loc[0, "param_bytes"] == (16 * 8 + 16) * 4
    assert ops.loc[0, "macs"] == 4 * 8 * 16
    assert tuple(costs.op_s[4]) == (2e-3, 2e-3, 2e-3) and costs.op_source[4, 0] == "unknown"
    assert not ops.loc[4, "known"] and not costs.kernels[4].any()
    assert costs.kernels[0].all() and bool(ops.loc[0, "known"])

    rows = {}
    for x, name in enumerate(t.names):
        rows.setdefault(name, []).append(x)
    assert set(rows) == {"data", "w1", "b1", "h", "w2", "b2", "y", "p", "q"}
    # the in-place Relu starts a new version of h: two rows, each read by its own op
    versions = {(t.names[x], int(t.producer[x])): t.readers(x).tolist() for x in range(len(t))}
    assert versions[("h", 0)] == [1] and versions[("h", 1)] == [2]
    assert versions[("data", -1)] == [0] and versions[("w2", -2)] == [2]
    (p,), (q,), (data,) = rows["p"], rows["q"], rows["data"]
    assert (int(t.producer[p]), t.readers(p).tolist(), bool(t.external_output[p])) == (3, [4], True)
    assert (int(t.producer[q]), t.readers(q).tolist(), t.nbytes[q]) == (4, [], 0.0)
    assert not t.external_output[rows["h"]].any()
    assert t.nbytes[data] == 4 * 8 * 4
    # copy times come from the machine's links: host -> cuda:0 at the V100's PCIe figure
    tables = machine.link_classes()
    secs = tables.class_seconds(t.nbytes)
    assert secs[tables.link_class[0, 1], data] == pytest.approx(1e-5 + 128 / 12e9)
    assert costs.param_bytes == (16 * 8 + 16 + 10 * 16 + 10) * 4
    # data, h, y, p (q has no known shape): 4x8 + 4x16 + 4x10 + 4x10 floats
    assert costs.memory_footprint() == {"param_bytes": costs.param_bytes,
                                        "activation_bytes": (32 + 64 + 40 + 40) * 4}


def test_type_fit_wins_over_family_fit():
    """A family mixing a cheap and a dear op type: each type with enough points gets its own fit."""
    def point(t, n, seconds):
        return OpTiming(t, (TensorType((n, 4)),), {}, 5, seconds, 0.0, float(n), 16.0 * n)
    gathers = [point("Gather", n, 8e-6) for n in (8, 16, 32)]
    sls = [point("SparseLengthsSum", n, 40e-6) for n in (8, 16, 32)]
    model = CostModel(_cpu(gathers + sls), default_profiles()[1])
    assert {"embedding", "type:Gather", "type:SparseLengthsSum"} <= set(model.fits("cpu"))
    f = OpFeatures(flops=24.0, bytes_read=16.0 * 24)
    t_sls, src = model.op_time("SparseLengthsSum", (TensorType((24, 4)),), {}, f, "cpu")
    t_gather, _ = model.op_time("Gather", (TensorType((24, 4)),), {}, f, "cpu")
    assert src == "fitted"
    assert t_sls == pytest.approx(40e-6, rel=0.05) and t_gather == pytest.approx(8e-6, rel=0.05)


# ------------------------------------------------------------ matrix products by rows

GEMM_BW = 5e10  # 2 flops per byte at the peak: an FC of 8 rows or more binds on compute


def _gemm_truth(m, k, n, eff_max, m0, o=4e-6, em=0.9):
    """An FC timed on a device whose GEMM efficiency is eff_max * M / (M + M0)."""
    flops, nbytes = 2.0 * m * k * n, 4.0 * (m * k + k * n + n + m * n)
    eff = eff_max * (m / (m + m0) if m > 1 else 1.0)
    seconds = o + max(flops / (PEAK * eff), nbytes / (GEMM_BW * em))
    types = (TensorType((m, k)), TensorType((n, k)), TensorType((n,)))
    return OpTiming("FC", types, {}, 10, seconds, 0.0, flops, nbytes)


def _gemm_cpu(ops) -> DeviceProfile:
    prof = _cpu(ops)
    prof.memory_bandwidth_bytes_per_s = GEMM_BW
    return prof


def test_gemm_dims_per_op_type():
    t = TensorType
    assert gemm_dims("FC", (t((8, 4, 2, 3)), t((5, 24))), {}) == (8, 5)
    assert gemm_dims("FC", (t((8, 4, 2, 3)), t((5, 6))), {"axis": 2}) == (32, 5)
    assert gemm_dims("FCTransposed", (t((8, 24)), t((24, 5))), {}) == (8, 5)
    assert gemm_dims("MatMul", (t((24, 8)), t((5, 24))), {"trans_a": 1, "trans_b": 1}) == (8, 5)
    assert gemm_dims("BatchMatMul", (t((64, 27, 128)), t((64, 27, 128))), {"trans_b": 1}) == (27, 27)
    assert gemm_dims("BatchMatMul", (t((64, 128, 27)), t((64, 128, 9))), {"trans_a": True}) == (27, 9)
    assert gemm_dims("Relu", (t((8, 4)), t((8, 4))), {}) is None
    assert row_efficiency((8, 100), 8.0) == pytest.approx(0.5)
    assert row_efficiency((1, 4096), 8.0) == 1.0   # a matrix-vector product: the memory term prices it
    assert row_efficiency((8, 100), None) == 1.0


def test_gemm_fit_recovers_known_half_efficiency_rows():
    """Points at many row counts identify M0 and the large-M efficiency, even against an
    anchor that says the peak is reached (the data outweigh it)."""
    points = [_gemm_truth(m, k, n, eff_max=0.8, m0=12.0)
              for m in (1, 2, 4, 8, 16, 32, 64, 128, 256) for k, n in ((256, 512), (1024, 1024))]
    dims = [gemm_dims(p.type, p.inputs, p.args) for p in points]
    fit = fit_family(points, PEAK, GEMM_BW, 2e-6, "fc", "cpu", dims, anchor_efficiency=1.0)
    assert fit.half_efficiency_rows == pytest.approx(12.0, rel=0.05)
    assert fit.compute_efficiency == pytest.approx(0.8, rel=0.03)
    assert fit.median_abs_pct_error < 1.0
    plain = fit_family(points, PEAK, GEMM_BW, 2e-6, "fc", "cpu")   # no dims: one efficiency for all
    assert plain.half_efficiency_rows is None and plain.median_abs_pct_error > 10


def test_batch64_fc_predicted_from_batch8_points_and_the_peak():
    """Every point at M=8 cannot split eff_max from M0; the measured peak (a 1024-row GEMM,
    efficiency 1) does, so batch-64 FCs come out within 5%, where a fit of one efficiency
    over-predicts them by more than half."""
    shapes = [(256, 512), (512, 256), (1024, 1024), (479, 1024), (4096, 1000), (2048, 1000)]
    b8 = [_gemm_truth(8, k, n, eff_max=1.0, m0=9.0) for k, n in shapes]
    model = CostModel(_gemm_cpu(b8), default_profiles()[1], use_measured=False)
    assert model.fits("cpu")["type:FC"].half_efficiency_rows == pytest.approx(9.0, rel=0.05)
    plain = fit_family(b8, PEAK, GEMM_BW, 2e-6, "fc", "cpu")
    for k, n in [(512, 256), (1024, 1024), (1024, 512), (9216, 4096)]:
        truth = _gemm_truth(64, k, n, eff_max=1.0, m0=9.0)
        feats = OpFeatures(flops=truth.flops, bytes_read=truth.bytes)
        t, src = model.op_time("FC", truth.inputs, {}, feats, "cpu")
        assert src == "fitted" and t == pytest.approx(truth.median_s, rel=0.05)
        flat = plain.overhead_s + max(truth.flops / (PEAK * plain.compute_efficiency),
                                      truth.bytes / (GEMM_BW * plain.memory_efficiency))
        assert flat > 1.5 * truth.median_s


def test_gemm_fit_survives_a_profile_round_trip():
    """Stored fits keep M0; a fit stored without it (an older profile) loads as one
    efficiency for every row count, and other families never carry the field."""
    import json

    from placer.hardware.device_profile import Profile, profile_from_dict, profile_to_dict
    relu = [OpTiming("Relu", (TensorType((n, 64)),), {}, 5, 1e-6 * n, 0.0, 64.0 * n, 512.0 * n) for n in (8, 64)]
    prof = _gemm_cpu([_gemm_truth(8, k, n, eff_max=1.0, m0=9.0) for k, n in [(256, 512), (1024, 1024)]] + relu)
    prof.fits = CostModel(prof, default_profiles()[1]).fits("cpu")
    data = json.loads(json.dumps(profile_to_dict(Profile("p", {"cpu": prof}))))
    stored = data["devices"][0]["fits"]
    assert stored["type:FC"]["half_efficiency_rows"] > 0 and "half_efficiency_rows" not in stored["elementwise"]
    loaded = profile_from_dict(data).device("cpu")
    assert loaded.fits == prof.fits

    del stored["type:FC"]["half_efficiency_rows"], stored["fc"]["half_efficiency_rows"]
    del data["devices"][0]["ops"]                      # stored fits are used only without ops
    old = profile_from_dict(data).device("cpu")
    assert old.fits["type:FC"].half_efficiency_rows is None
    loaded.ops = {}
    x = (TensorType((64, 512)), TensorType((256, 512)))
    fc = OpFeatures(flops=2.0 * 64 * 512 * 256, bytes_read=4.0 * (64 * 512 + 512 * 256))
    with_rows, _ = CostModel(loaded, default_profiles()[1]).op_time("FC", x, {}, fc, "cpu")
    flat, _ = CostModel(old, default_profiles()[1]).op_time("FC", x, {}, fc, "cpu")
    fit = old.fits["type:FC"]
    assert flat == pytest.approx(fit.overhead_s + max(fc.flops / (PEAK * fit.compute_efficiency),
                                                      fc.bytes_read / (GEMM_BW * fit.memory_efficiency)))
    assert with_rows == pytest.approx(_gemm_truth(64, 512, 256, 1.0, 9.0).median_s, rel=0.1) and with_rows != flat


# ----------------------------------------------------------------- fit quality

def test_variants_separate_what_runs_differently():
    from placer.costs.model import variant_of
    x = TensorType((1, 32, 28, 28))

    def conv(cout, cin_per_group, k, **args):
        return variant_of("Conv", (x, TensorType((cout, cin_per_group, k, k))), args)
    assert conv(64, 32, 1) == "Conv/k1" and conv(64, 32, 3) == "Conv/k3" and conv(64, 32, 5) == "Conv/k5+"
    assert conv(32, 1, 3, group=32) == "Conv/depthwise"
    assert conv(32, 8, 3, group=4) == "Conv/grouped"
    nhwc = variant_of("Conv", (TensorType((1, 28, 28, 32)), TensorType((32, 3, 3, 1))), {"order": "NHWC"})
    assert nhwc == "Conv/depthwise"
    parts = [TensorType((8, 16))]
    assert variant_of("Concat", parts * 4, {}) == "Concat/few"
    assert variant_of("Concat", parts * 27, {"add_axis": 1}) == "Concat/many"
    assert variant_of("Relu", parts, {}) is None


def _relu_points(spread=0.1):
    """Relu timings that follow one roofline exactly (iqr = spread x median)."""
    out = []
    for n in (8, 64, 512, 4096, 32768):
        t = _truth(n, 8.0 * n, o=2e-6, ec=0.2, em=0.8)
        out.append(OpTiming("Relu", (TensorType((n, 16)),), {}, 5, t, spread * t, float(n), 8.0 * n))
    return out


def _two_kernel_fc_points():
    """FC timings from two kernels behind one op type: every other point 4x slower."""
    pts = []
    for i, (m, k, n) in enumerate([(8, 256, 256), (64, 1024, 512), (4, 4096, 1024), (256, 512, 1024),
                                   (16, 128, 64), (32, 2048, 2048), (128, 256, 128), (2, 1024, 4096)]):
        p = _fc_point(m, k, n)
        p.median_s *= 4.0 if i % 2 else 1.0
        pts.append(p)
    return pts


def test_fit_quality_is_measured_on_its_points():
    """The stored median / p90 error are the model's own errors on the fit's points, and the
    spread is the points' median IQR / median."""
    pts = _relu_points(spread=0.1)
    pts[0].iqr_s = 0.5 * pts[0].median_s
    model = CostModel(_cpu(pts), default_profiles()[1], use_measured=False)
    fit = model.fits("cpu")["type:Relu"]
    errs = []
    for p in pts:
        t, src = model.op_time("Relu", p.inputs, {}, OpFeatures(flops=p.flops, bytes_read=p.bytes), "cpu")
        errs.append(abs(t - p.median_s) / p.median_s * 100)
        assert src == "fitted"
    assert fit.median_abs_pct_error == pytest.approx(np.median(errs), abs=1e-6)
    assert fit.p90_abs_pct_error == pytest.approx(np.percentile(errs, 90), abs=1e-6)
    assert fit.spread_pct == pytest.approx(10.0) and fit.covered


def test_a_family_one_roofline_cannot_cover_is_labelled():
    from placer.hardware.constants import FIT_MAX_MEDIAN_ERROR_PCT
    model = CostModel(_cpu(_two_kernel_fc_points() + _relu_points()), default_profiles()[1], use_measured=False)
    fits = model.fits("cpu")
    assert fits["type:FC"].median_abs_pct_error > FIT_MAX_MEDIAN_ERROR_PCT and not fits["type:FC"].covered
    assert not fits["fc"].covered and fits["type:Relu"].covered
    new = _fc_point(48, 768, 384)
    t, src = model.op_time("FC", new.inputs, {}, OpFeatures(flops=new.flops, bytes_read=new.bytes), "cpu")
    assert src == "poor-fit" and t > 0
    relu = OpFeatures(flops=100.0, bytes_read=800.0)
    assert model.op_time("Relu", (TensorType((100, 1)),), {}, relu, "cpu")[1] == "fitted"
    report = model.fit_report("cpu").set_index("group")
    assert not report.loc["type:FC", "covered"] and report.loc["type:Relu", "covered"]


def test_the_finest_covering_fit_prices_an_op():
    from placer.costs.model import choose_fit
    from placer.hardware.device_profile import FamilyFit

    def fit(covered, overhead):
        return FamilyFit(overhead, 0.5, 0.5, 5, 1.0 if covered else 60.0, covered=covered)
    k3_poor, conv_type, conv_family = fit(False, 1.0), fit(True, 2.0), fit(True, 3.0)
    ins = (TensorType((1, 8, 8, 8)), TensorType((8, 8, 3, 3)))
    fits = {"type:Conv/k3": k3_poor, "type:Conv": conv_type, "conv": conv_family}
    assert choose_fit(fits, "Conv", ins, {}) is conv_type
    assert choose_fit({"type:Conv/k3": k3_poor, "conv": fit(False, 3.0)}, "Conv", ins, {}) is k3_poor
    assert choose_fit({"conv": conv_family}, "Conv", ins, {}) is conv_family
    assert choose_fit({}, "Conv", ins, {}) is None


def test_op_spread_follows_the_source_of_the_time():
    pts = _relu_points(spread=0.2)
    pts[2].iqr_s = 0.05 * pts[2].median_s
    model = CostModel(_cpu(pts), default_profiles()[1])
    p = pts[2]
    feats = OpFeatures(flops=p.flops, bytes_read=p.bytes)
    assert model.op_spread("Relu", p.inputs, {}, feats, "cpu") == pytest.approx(0.05)       # measured entry
    other = (TensorType((100, 16)),)
    assert model.op_spread("Relu", other, {}, feats, "cpu") == pytest.approx(0.2)          # the fit's points
    conv = (TensorType((1, 3, 8, 8)), TensorType((4, 3, 3, 3)))
    assert model.op_spread("Conv", conv, {"kernel": 3}, OpFeatures(flops=1e6), "cpu") == 0.0  # roofline
    assert model.op_spread("Relu", other, {}, feats, "gpu") == 0.0                           # datasheet GPU


def test_stored_fits_of_the_same_entries_are_not_fitted_again(monkeypatch):
    import placer.costs.model as costs
    from placer.hardware.device_profile import Profile, profile_from_dict, profile_to_dict
    prof = _cpu(_relu_points() + _two_kernel_fc_points())
    prof.fits = CostModel(prof, default_profiles()[1]).fits("cpu")
    prof.fits_digest = prof.fit_inputs_digest(costs.FIT_VERSION)
    loaded = profile_from_dict(profile_to_dict(Profile("p", {"cpu": prof}))).device("cpu")
    calls = []
    real = costs.fit_family
    monkeypatch.setattr(costs, "fit_family", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert CostModel(loaded, default_profiles()[1]).fits("cpu") == prof.fits and not calls
    loaded.peak_flops["float32"] *= 2          # fits are relative to the peak: refit
    CostModel(loaded, default_profiles()[1]).fits("cpu")
    assert calls
    calls.clear()
    loaded.peak_flops["float32"] /= 2
    next(iter(loaded.ops.values())).median_s *= 1.5   # another entry: refit
    CostModel(loaded, default_profiles()[1]).fits("cpu")
    assert calls
